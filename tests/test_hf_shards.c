/* tests/test_hf_shards.c: Hugging Face directories as people have them:
 * model.safetensors.index.json (weight_map) over shards, tokenizer.json,
 * every family's config written by xent_model_save_hf and read back, the
 * built-in configurations and random weights; and the hostile cases of the
 * index and tokenizer.json readers (a path outside the directory, a shard
 * that is missing or disagrees with the index, a FIFO, ids with a gap). */
#include "harness.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *mkdir_tmp(void) {
    static char buf[64];
    snprintf(buf, sizeof buf, "/tmp/xent_hf_XXXXXX");
    return mkdtemp(buf);
}

static void rm_rf(const char *d) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    CHECK(system(cmd) == 0, "rm");
}

static void put(const char *dir, const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    fputs(text, f);
    fclose(f);
}

static xent_model *tiny(const char *arch) {
    xent_model_config c;
    xent_model_config_init(&c);
    snprintf(c.arch, sizeof c.arch, "%s", arch);
    if (xent_model_config_family(&c)) return NULL;
    c.n_layers = 2, c.dim = 16, c.hidden = 24, c.n_heads = 2, c.n_kv_heads = 1;
    c.head_dim = 8, c.vocab = 40, c.max_seq = 64, c.init_std = 0.3;
    c.tied_head = c.norm_plus_one;
    if (c.swa_pattern) c.sliding_window = 3;
    if (!strcmp(arch, "gemma2")) c.attn_softcap = 5, c.final_softcap = 7, c.query_scalar = 12;
    if (!strcmp(arch, "gemma3_text")) {
        c.swa_pattern = 2, c.rope_local_theta = 10000, c.rope_theta = 1e6, c.query_scalar = 8;
        c.rope_scaling = XENT_ROPE_LINEAR, c.rope_factor = 4;
    }
    xent_model *m = NULL;
    if (xent_model_init_random(&c, 7, &m)) return NULL;
    /* the norms' weights random too, so that they matter */
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i].ndim == 1)
            for (int64_t k = 0; k < m->params[i].numel; k++)
                m->params[i].w[k] += 0.1f * (float)((k * 7 + i) % 5) - 0.2f;
    return m;
}

static double loss_of(const xent_model *m) {
    int32_t tok[12];
    for (int i = 0; i < 12; i++) tok[i] = (i * 13 + 5) % (int)m->cfg.vocab;
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = 2, o.S = 6, o.tokens = tok;
    double l = NAN;
    if (xent_model_run_f64(m, &o, &l, NULL, NULL)) return NAN;
    return l;
}

/* save_hf -> load_hf for every family: same config features, same loss. */
TEST(hf_families_roundtrip) {
    static const char *const fam[] = {"llama", "qwen2", "qwen3", "mistral", "gemma2",
                                      "gemma3_text"};
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        xent_model *m = tiny(fam[i]);
        CHECK(m, "%s: %s", fam[i], xent_last_error());
        if (!m) continue;
        char *d = mkdir_tmp();
        CHECK(xent_model_save_hf(m, d, XENT_F32) == XENT_OK, "%s: save: %s", fam[i],
              xent_last_error());
        xent_model *r = NULL;
        xent_status st = xent_model_load_hf(d, &r);
        CHECK(st == XENT_OK, "%s: load: %s", fam[i], xent_last_error());
        if (r) {
            const xent_model_config *a = &m->cfg, *b = &r->cfg;
            CHECK(!strcmp(a->arch, b->arch) && a->qk_norm == b->qk_norm &&
                      a->sandwich_norm == b->sandwich_norm && a->gelu_tanh == b->gelu_tanh &&
                      a->sliding_window == b->sliding_window && a->swa_pattern == b->swa_pattern &&
                      a->attn_softcap == b->attn_softcap && a->final_softcap == b->final_softcap &&
                      a->query_scalar == b->query_scalar &&
                      a->rope_local_theta == b->rope_local_theta &&
                      a->rope_scaling == b->rope_scaling,
                  "%s: the configuration did not round-trip", fam[i]);
            double l0 = loss_of(m), l1 = loss_of(r);
            CHECK(l0 == l1 && isfinite(l0), "%s: loss %.17g after the round trip, %.17g before",
                  fam[i], l1, l0);
            CHECK(!r->tok && strstr(r->tok_note, "no tokenizer.json"), "%s: tokenizer note '%s'",
                  fam[i], r->tok_note);
        }
        xent_model_free(r);
        xent_model_free(m);
        rm_rf(d);
    }
}

/* An index over the one file save_hf writes: each weight_map entry is
 * "NAME": "model.safetensors"; then one entry edited. */
static void write_index(const xent_model *m, const char *dir, const char *bad_name,
                        const char *bad_file, int drop_last) {
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(p, "wb");
    fputs("{\"metadata\": {\"total_size\": 1}, \"weight_map\": {", f);
    int n = m->n_params - (drop_last ? 1 : 0);
    for (int i = 0; i < n; i++) {
        const char *fn = bad_name && !strcmp(bad_name, m->params[i].name) ? bad_file
                                                                          : "\"model.safetensors\"";
        fprintf(f, "%s\"%s\": %s", i ? ", " : "", m->params[i].name, fn);
    }
    fputs("}}", f);
    fclose(f);
}

TEST(hf_index_and_hostile_shards) {
    xent_model *m = tiny("qwen3");
    if (!m) return;
    const char *q = "model.layers.1.self_attn.k_norm.weight";
    struct {
        const char *name, *file;
        int drop_last;
        xent_status want;
        const char *msg;
    } cases[] = {
        {NULL, NULL, 0, XENT_OK, NULL},
        {q, "\"../model.safetensors\"", 0, XENT_ERR_FORMAT, "not the name of a .safetensors"},
        {q, "\"/etc/passwd.safetensors\"", 0, XENT_ERR_FORMAT, "not the name"},
        {q, "\"other.safetensors\"", 0, XENT_ERR_IO, "other.safetensors"},
        {q, "17", 0, XENT_ERR_FORMAT, "not the name"},
        {NULL, NULL, 1, XENT_ERR_FORMAT, "not in weight_map"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *d = mkdir_tmp();
        CHECK(xent_model_save_hf(m, d, XENT_BF16) == XENT_OK, "%s", xent_last_error());
        write_index(m, d, cases[c].name, cases[c].file, cases[c].drop_last);
        xent_model *r = NULL;
        xent_status st = xent_model_load_hf(d, &r);
        CHECK(st == cases[c].want, "case %zu: status %d, want %d (%s)", c, (int)st,
              (int)cases[c].want, xent_last_error());
        if (cases[c].msg)
            CHECK(strstr(xent_last_error(), cases[c].msg), "case %zu: message '%s'", c,
                  xent_last_error());
        CHECK(!st == !!r, "case %zu: model", c);
        xent_model_free(r);
        rm_rf(d);
    }
    /* a shard the index names that disagrees with where the tensor is */
    char *d = mkdir_tmp();
    CHECK(xent_model_save_hf(m, d, XENT_F32) == XENT_OK, "%s", xent_last_error());
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s/model.safetensors", d);
    snprintf(dst, sizeof dst, "%s/model-00002-of-00002.safetensors", d);
    CHECK(link(src, dst) == 0, "link");
    write_index(m, d, q, "\"model-00002-of-00002.safetensors\"", 0);
    xent_model *r = NULL;
    CHECK(xent_model_load_hf(d, &r) == XENT_ERR_FORMAT && !r, "two shards holding the same "
          "tensors: %s", xent_last_error());
    /* the index as a FIFO is refused without blocking */
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    unlink(p);
    unlink(dst);
    CHECK(mkfifo(p, 0600) == 0, "mkfifo");
    CHECK(xent_model_load_hf(d, &r) == XENT_ERR_IO && !r && strstr(xent_last_error(), "regular"),
          "index FIFO: %s", xent_last_error());
    unlink(p);
    /* tokenizer.json: a FIFO, malformed, a gap in the ids, unsupported */
    snprintf(p, sizeof p, "%s/tokenizer.json", d);
    CHECK(mkfifo(p, 0600) == 0, "mkfifo");
    CHECK(xent_model_load_hf(d, &r) == XENT_ERR_IO && !r, "tokenizer FIFO: %s", xent_last_error());
    unlink(p);
    struct { const char *text; xent_status want; const char *msg; } toks[] = {
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2}, \"merges\": []},"
         " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", XENT_ERR_FORMAT, "id 1"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []},"
         " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", XENT_ERR_FORMAT, "vocab['a']"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [3]},"
         " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", XENT_ERR_FORMAT, "merges[0]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
         " \"added_tokens\": [{\"id\": 99999999999, \"content\": \"x\"}],"
         " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", XENT_ERR_FORMAT, "added_tokens[0]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []",
         XENT_ERR_FORMAT, "tokenizer.json"},
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", XENT_OK, "Unigram"},
        {"{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {\"a\": 0},"
         " \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Metaspace\"}}", XENT_OK,
         "with a pre_tokenizer"},
        {"{\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"vocab\": {\"a\": 0},"
         " \"merges\": []}, \"normalizer\": {\"type\": \"NFC\"}}", XENT_OK, "needs the normalizer"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
         " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
         "\"Split\", \"pattern\": {\"Regex\": \"\\\\w+\"}}, {\"type\": \"ByteLevel\", "
         "\"use_regex\": false}]}}", XENT_OK, "Split pattern"},
    };
    for (size_t c = 0; c < sizeof toks / sizeof toks[0]; c++) {
        put(d, "tokenizer.json", toks[c].text);
        xent_status st = xent_model_load_hf(d, &r);
        CHECK(st == toks[c].want, "tokenizer case %zu: status %d, want %d (%s)", c, (int)st,
              (int)toks[c].want, xent_last_error());
        const char *msg = st ? xent_last_error() : r ? r->tok_note : "";
        CHECK(strstr(msg, toks[c].msg), "tokenizer case %zu: message '%s'", c, msg);
        CHECK(!r || !r->tok, "tokenizer case %zu: a tokenizer was made", c);
        xent_model_free(r);
        r = NULL;
    }
    rm_rf(d);
    xent_model_free(m);
}

/* The SentencePiece-style form with Prepend (Llama 2's tokenizer.json):
 * ids as Hugging Face tokenizers 0.23 gives them for this file (the piece
 * after a special token gets its own U+2581; '!' is not in the vocabulary
 * and falls back to its byte token), and the decode. */
TEST(hf_tokenizer_spm_prepend) {
    static const char js[] =
        "{\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", \"special\": true}],"
        " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
        "{\"type\": \"Prepend\", \"prepend\": \"\\u2581\"}, {\"type\": \"Replace\", "
        "\"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},"
        " \"pre_tokenizer\": null, \"model\": {\"type\": \"BPE\", \"byte_fallback\": true,"
        " \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"<0x21>\": 2, \"\\u2581\": 3, \"a\": 4,"
        " \"b\": 5, \"\\u2581a\": 6, \"\\u2581ab\": 7, \"\\u2581b\": 8},"
        " \"merges\": [\"\\u2581 a\", \"\\u2581a b\", \"\\u2581 b\"]}}";
    static const struct { const char *text; int32_t ids[4]; int64_t n; const char *back; } cs[] = {
        {"ab b!", {7, 8, 2}, 3, "ab b!"},
        {"<s>a", {1, 6}, 2, "<s> a"},
        {"a<s> b", {6, 1, 3, 8}, 4, "a<s>  b"},
    };
    xent_tokenizer *t = NULL;
    CHECK(xent_tokenizer_from_json(js, sizeof js - 1, "spm.json", &t) == XENT_OK, "load: %s",
          xent_last_error());
    if (!t) return;
    CHECK(!strcmp(xent_tokenizer_pre(t), "spm-prepend"), "pre '%s'", xent_tokenizer_pre(t));
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        int32_t *ids = NULL;
        int64_t n = 0;
        CHECK(xent_tokenize(t, cs[c].text, strlen(cs[c].text), &ids, &n) == XENT_OK, "%s",
              xent_last_error());
        int same = n == cs[c].n;
        for (int64_t i = 0; same && i < n; i++) same = ids[i] == cs[c].ids[i];
        CHECK(same, "'%s': %lld ids [%d %d ...]", cs[c].text, (long long)n, n > 0 ? ids[0] : -1,
              n > 1 ? ids[1] : -1);
        char *back = NULL;
        CHECK(xent_detokenize(t, ids, n, &back, NULL) == XENT_OK && !strcmp(back, cs[c].back),
              "'%s' decodes to '%s'", cs[c].text, back ? back : "(null)");
        free(back);
        free(ids);
    }
    xent_tokenizer_free(t);
}

/* Built-in configurations and random weights: shapes, labels, seeds. */
TEST(hf_builtin_configs_and_random_init) {
    struct { const char *name; int64_t nw; } b[] = {
        {"qwen2.5-0.5b", 494032768}, {"smollm2-135m", 134515008},
        {"llama-3.2-1b", 1235814400}, {"qwen2.5-7b", 7615616512}};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
        xent_model_config c;
        CHECK(xent_model_config_named(b[i].name, &c) == XENT_OK, "%s: %s", b[i].name,
              xent_last_error());
        /* counted on 1 and 2 layers with a vocabulary of 1 (small
         * allocations), the rest added: (L - 1) layers, (V - 1) rows of the
         * embedding and of an untied head */
        int64_t per = 0, L = c.n_layers, V = c.vocab;
        c.n_layers = 1;
        c.vocab = 1;
        xent_model *one = NULL, *two = NULL;
        xent_model_new(&c, &one);
        c.n_layers = 2;
        xent_model_new(&c, &two);
        if (one && two) per = xent_model_n_weights(two) - xent_model_n_weights(one);
        int64_t total = one && two ? xent_model_n_weights(one) + (L - 1) * per +
                                         (V - 1) * c.dim * (c.tied_head ? 1 : 2)
                                   : 0;
        CHECK(total == b[i].nw, "%s: %lld parameters, expected %lld", b[i].name,
              (long long)total, (long long)b[i].nw);
        xent_model_free(one), xent_model_free(two);
    }
    xent_model_config c;
    CHECK(xent_model_config_named("no-such-model", &c) == XENT_ERR_NOT_FOUND &&
              strstr(xent_last_error(), "qwen2.5-0.5b"),
          "unknown name: %s", xent_last_error());
    xent_model *a = tiny("gemma2"), *b2 = tiny("gemma2");
    CHECK(a && b2 && a->random_weights && !strcmp(a->source_type, "random weights"), "label");
    int same = a && b2;
    for (int i = 0; same && i < a->n_params; i++)
        same = !memcmp(a->params[i].w, b2->params[i].w, (size_t)a->params[i].numel * 4);
    CHECK(same, "the same seed gives different weights");
    /* normal(0, init_std): the embedding's sample deviation */
    double s2 = 0;
    int64_t n = a ? a->params[0].numel : 0;
    for (int64_t k = 0; k < n; k++) s2 += (double)a->params[0].w[k] * a->params[0].w[k];
    CHECK(n && fabs(sqrt(s2 / (double)n) - 0.3) < 0.05, "std %g, expected 0.3",
          n ? sqrt(s2 / (double)n) : 0.0);
    xent_model_free(a), xent_model_free(b2);
}
