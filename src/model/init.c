/* src/model/init.c: built-in configurations at real shapes and random
 * weights (the families' initializer), for runs without a checkpoint. */
#include "model/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The numbers are those of each model's config.json on the Hugging Face hub
 * (docs/model.md, "Built-in configurations", names the repositories). */
typedef struct {
    const char *name, *arch;
    int64_t L, D, H, nh, nkv, hd, V, ctx;
    double theta, eps, std;
    int tied;
    int64_t bos, eos;
    int llama3; /* rope_scaling llama3: factor 32, low 1, high 4, orig 8192 */
} builtin;

static const builtin k_builtins[] = {
    /* Qwen/Qwen2.5-0.5B */
    {"qwen2.5-0.5b", "qwen2", 24, 896, 4864, 14, 2, 64, 151936, 32768, 1e6, 1e-6, 0.02, 1,
     151643, 151643, 0},
    /* Qwen/Qwen2.5-7B */
    {"qwen2.5-7b", "qwen2", 28, 3584, 18944, 28, 4, 128, 152064, 131072, 1e6, 1e-6, 0.02, 0,
     151643, 151643, 0},
    /* meta-llama/Llama-3.2-1B */
    {"llama-3.2-1b", "llama", 16, 2048, 8192, 32, 8, 64, 128256, 131072, 500000.0, 1e-5, 0.02,
     1, 128000, 128001, 1},
    /* HuggingFaceTB/SmolLM2-135M */
    {"smollm2-135m", "llama", 30, 576, 1536, 9, 3, 64, 49152, 8192, 100000.0, 1e-5,
     0.041666666666666664, 1, 0, 0, 0},
};

const char *xent_model_config_builtins(void) {
    return "qwen2.5-0.5b, qwen2.5-7b, llama-3.2-1b, smollm2-135m";
}

xent_status xent_model_config_builtin(const char *name, xent_model_config *c) {
    if (!name || !c) return xent_set_error(XENT_ERR_NULL, "config_builtin: NULL");
    for (size_t i = 0; i < sizeof k_builtins / sizeof k_builtins[0]; i++) {
        const builtin *b = &k_builtins[i];
        if (strcmp(b->name, name)) continue;
        xent_model_config_init(c);
        snprintf(c->arch, sizeof c->arch, "%s", b->arch);
        xent_status st = xent_model_config_family(c);
        if (st) return st;
        c->n_layers = b->L, c->dim = b->D, c->hidden = b->H, c->n_heads = b->nh;
        c->n_kv_heads = b->nkv, c->head_dim = b->hd, c->vocab = b->V, c->max_seq = b->ctx;
        c->rope_theta = b->theta, c->norm_eps = b->eps, c->init_std = b->std;
        c->tied_head = b->tied, c->bos_id = b->bos, c->eos_id = b->eos;
        if (b->llama3) {
            c->rope_scaling = XENT_ROPE_LLAMA3;
            c->rope_factor = 32, c->rope_low_freq_factor = 1, c->rope_high_freq_factor = 4;
            c->rope_orig_ctx = 8192;
        }
        return xent_model_config_check(c);
    }
    return xent_set_error(XENT_ERR_NOT_FOUND, "no built-in configuration '%s' (built in: %s; "
                          "or a config.json file)", name, xent_model_config_builtins());
}

xent_status xent_model_config_named(const char *spec, xent_model_config *c) {
    if (!spec || !c) return xent_set_error(XENT_ERR_NULL, "config: NULL");
    for (size_t i = 0; i < sizeof k_builtins / sizeof k_builtins[0]; i++)
        if (!strcmp(k_builtins[i].name, spec)) return xent_model_config_builtin(spec, c);
    struct stat sb;
    if (stat(spec, &sb) != 0)
        return xent_set_error(XENT_ERR_NOT_FOUND, "'%s' is neither a built-in configuration (%s) "
                              "nor a file", spec, xent_model_config_builtins());
    if (S_ISDIR(sb.st_mode)) {
        char path[1100];
        snprintf(path, sizeof path, "%s/config.json", spec);
        return xent_model_config_file(path, c);
    }
    return xent_model_config_file(spec, c);
}

/* splitmix64 of (seed, parameter, row): every row's stream is fixed by
 * the seed alone, whatever the thread that draws it. */
static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

typedef struct {
    xent_param *p;
    int64_t cols;
    float sd;
    uint64_t key;
} rand_job;

/* Rows [r0, r1): normal(0, sd) by Box-Muller on 53-bit uniforms. */
static void rand_rows(void *vj, int64_t r0, int64_t r1) {
    const rand_job *j = vj;
    for (int64_t r = r0; r < r1; r++) {
        uint64_t s = mix(j->key ^ mix((uint64_t)r));
        float *w = j->p->w + r * j->cols;
        for (int64_t k = 0; k < j->cols; k += 2) {
            s = mix(s);
            double u1 = ((double)(s >> 11) + 1.0) / 9007199254740993.0;
            s = mix(s);
            double u2 = (double)(s >> 11) / 9007199254740992.0;
            double rr = sqrt(-2.0 * log(u1)), a = 2.0 * M_PI * u2;
            w[k] = (float)(j->sd * rr * cos(a));
            if (k + 1 < j->cols) w[k + 1] = (float)(j->sd * rr * sin(a));
        }
    }
}

xent_status xent_model_init_random(const xent_model_config *cfg, uint64_t seed,
                                   xent_model **out) {
    if (!cfg || !out) return xent_set_error(XENT_ERR_NULL, "init_random: NULL");
    xent_model *m = NULL;
    xent_status st = xent_model_new(cfg, &m);
    if (st) return st;
    double sd = cfg->init_std > 0 ? cfg->init_std : 0.02;
    for (int i = 0; i < m->n_params; i++) {
        xent_param *p = &m->params[i];
        size_t n = strlen(p->name);
        int is_norm = n > 11 && strstr(p->name, "norm.weight") != NULL;
        if (p->ndim == 1) { /* biases 0; norms 1, or 0 under (1 + w) */
            float v = is_norm && !cfg->norm_plus_one ? 1.0f : 0.0f;
            for (int64_t k = 0; k < p->numel; k++) p->w[k] = v;
            continue;
        }
        rand_job j = {p, p->shape[1], (float)sd, mix(seed ^ mix((uint64_t)i + 1))};
        xent_parallel_for(p->shape[0], p->shape[0] < 64 ? 1 : 0, rand_rows, &j);
    }
    m->random_weights = 1;
    snprintf(m->source_type, sizeof m->source_type, "random weights");
    snprintf(m->source, sizeof m->source, "random weights (%s, seed %llu)", cfg->arch,
             (unsigned long long)seed);
    *out = m;
    return XENT_OK;
}
