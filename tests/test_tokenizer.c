/* tests/test_tokenizer.c: the byte-level BPE tokenizer.
 * 1. A hand-built vocabulary whose merges reveal how each pre-tokenizer
 *    (smollm, gpt2, llama3) chunks the text; expected ids derived by hand.
 * 2. SmolLM2's real tokenizer (GGUF from `make model`) on
 *    tests/data/model/tokenizer_text.txt against the ids the reference
 *    implementation produced (scripts/make_tokenizer_fixture.py); skipped
 *    when the model file is not present. */
#include "harness.h"
#include "model/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* GPT-2 byte -> unicode symbol, as UTF-8 (independent of the library's). */
static void byte_sym(int b, char *out) {
    int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    int cp = b;
    if (!keep) {
        int k = 0;
        for (int x = 0; x < b; x++)
            k += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
        cp = 256 + k;
    }
    if (cp < 128) out[0] = (char)cp, out[1] = 0;
    else out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 63)),
         out[2] = 0;
}

/* ids 0..255: bytes; 256 he, 257 the, 258 Ġt, 259 Ġthe, 260 <|s|>,
 * 261 20, 262 ĠĠ, 263 'S. Merges by rank: h e, t he, Ġ t, Ġt he, 2 0,
 * Ġ Ġ, ' S. */
static xent_tokenizer *tiny_tok(const char *pre) {
    static char syms[256][4];
    char *toks[264];
    size_t tl[264];
    int32_t types[264];
    for (int b = 0; b < 256; b++) {
        byte_sym(b, syms[b]);
        toks[b] = syms[b];
    }
    char *extra[] = {"he", "the", "\xC4\xA0t", "\xC4\xA0the", "<|s|>", "20",
                     "\xC4\xA0\xC4\xA0", "'S"};
    for (int i = 0; i < 8; i++) toks[256 + i] = extra[i];
    for (int i = 0; i < 264; i++) {
        tl[i] = strlen(toks[i]);
        types[i] = i == 260 ? 3 : 1;
    }
    char *mer[] = {"h e", "t he", "\xC4\xA0 t", "\xC4\xA0t he", "2 0",
                   "\xC4\xA0 \xC4\xA0", "' S"};
    size_t ml[7];
    for (int i = 0; i < 7; i++) ml[i] = strlen(mer[i]);
    xent_tokenizer *t = NULL;
    if (xent__tokenizer_new(toks, tl, 264, mer, ml, 7, types, pre, &t))
        return NULL;
    return t;
}

static void expect_ids(const char *pre, const char *text, const int32_t *want,
                       int64_t nw) {
    xent_tokenizer *t = tiny_tok(pre);
    CHECK(t != NULL, "tokenizer: %s", xent_last_error());
    if (!t) return;
    int32_t *ids = NULL;
    int64_t n = -1;
    CHECK(xent_tokenize(t, text, strlen(text), &ids, &n) == XENT_OK, "%s",
          xent_last_error());
    CHECK(n == nw, "%s: %lld ids, want %lld", pre, (long long)n,
          (long long)nw);
    for (int64_t i = 0; i < n && i < nw; i++)
        CHECK(ids[i] == want[i], "%s: ids[%lld] = %d, want %d", pre,
              (long long)i, ids[i], want[i]);
    char *back = NULL;
    size_t bl = 0;
    CHECK(xent_detokenize(t, ids, n, &back, &bl) == XENT_OK, "decode");
    CHECK(back && bl == strlen(text) && !memcmp(back, text, bl),
          "%s: decode gives '%s'", pre, back ? back : "");
    free(back);
    free(ids);
    xent_tokenizer_free(t);
}

static const char *TEXT = "the the  2024<|s|>'s'S";

TEST(tokenizer_smollm_pretokenizer) {
    /* the | Ġthe | ĠĠ | 2 | 0 | 2 | 4 | <|s|> | 's | ' | S
     * (" the": "t he" has rank 1 < "Ġ t" rank 2, so Ġ + the) */
    const int32_t w[] = {257, 32, 257, 262, 50, 48, 50, 52, 260, 39, 115, 39, 83};
    expect_ids("smollm", TEXT, w, 13);
}

TEST(tokenizer_gpt2_pretokenizer) {
    /* the | Ġthe | Ġ | Ġ2024 -> Ġ 20 2 4 | <|s|> | 's | ' | S */
    const int32_t w[] = {257, 32, 257, 32, 32, 261, 50, 52, 260, 39, 115, 39, 83};
    expect_ids("gpt2", TEXT, w, 13);
}

TEST(tokenizer_llama3_pretokenizer) {
    /* the | Ġthe | Ġ | Ġ | 202 -> 20 2 | 4 | <|s|> | 's | 'S (case-insens.);
     * Llama 3 ignores merges when a whole chunk is a token: Ġthe -> 259 */
    const int32_t w[] = {257, 259, 32, 32, 261, 50, 52, 260, 39, 115, 263};
    expect_ids("llama-bpe", TEXT, w, 11);
}

TEST(tokenizer_bytes_and_errors) {
    /* invalid UTF-8 and control bytes are encoded byte by byte and decode
     * back to the same bytes */
    const char txt[] = "a\x80\xff\n\r\t\x01z";
    const int32_t w[] = {97, 128, 255, 10, 13, 9, 1, 122};
    expect_ids("smollm", txt, w, 8);
    xent_tokenizer *t = tiny_tok("smollm");
    int32_t bad[] = {5, 264};
    char *s = NULL;
    CHECK(xent_detokenize(t, bad, 2, &s, NULL) == XENT_ERR_LABEL && !s,
          "id 264 accepted");
    int32_t *ids = NULL;
    int64_t n = -1;
    CHECK(xent_tokenize(t, "", 0, &ids, &n) == XENT_OK && n == 0, "empty");
    free(ids);
    xent_tokenizer_free(t);
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)l + 1);
    *n = b ? fread(b, 1, (size_t)l, f) : 0;
    if (b) b[*n] = 0;
    fclose(f);
    return b;
}

TEST(tokenizer_smollm2_reference_ids) {
    const char *env = getenv("XENT_MODEL_GGUF"), *home = getenv("HOME");
    char path[512];
    if (env) snprintf(path, sizeof path, "%s", env);
    else snprintf(path, sizeof path, "%s/.cache/xent/"
                  "SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "");
    if (access(path, R_OK) != 0) {
        xt_skip("no SmolLM2 GGUF (run `make model` or set XENT_MODEL_GGUF)");
        return;
    }
    size_t tn = 0, in = 0;
    char *text = slurp("tests/data/model/tokenizer_text.txt", &tn);
    char *idtxt = slurp("tests/data/model/tokenizer_ids.txt", &in);
    CHECK(text && idtxt, "fixtures missing (run from the repository root)");
    xent_model *m = NULL;
    CHECK(xent_model_load_gguf(path, &m) == XENT_OK, "%s", xent_last_error());
    if (!text || !idtxt || !m || !m->tok) goto done;
    int32_t *want = malloc(in * sizeof *want);
    int64_t nw = 0;
    for (char *p = idtxt, *e; *p; p = e) {
        long v = strtol(p, &e, 10);
        if (e == p) break;
        want[nw++] = (int32_t)v;
    }
    int32_t *ids = NULL;
    int64_t n = 0;
    CHECK(xent_tokenize(m->tok, text, tn, &ids, &n) == XENT_OK, "%s",
          xent_last_error());
    CHECK(n == nw && nw > 400, "%lld ids, reference %lld", (long long)n,
          (long long)nw);
    for (int64_t i = 0; i < n && i < nw; i++) {
        CHECK(ids[i] == want[i], "ids[%lld] = %d, reference %d", (long long)i,
              ids[i], want[i]);
        CHECK_LIMIT(5);
    }
    char *back = NULL;
    size_t bl = 0;
    CHECK(xent_detokenize(m->tok, ids, n, &back, &bl) == XENT_OK &&
              bl == tn && !memcmp(back, text, tn), "decode round trip");
    /* forward on the same tokens: transformers' LlamaForCausalLM (fp32,
     * eager, loss in float64; scripts/validate_transformers.py) gives
     * 3.461710231 and float64 3.4617102 +- 1e-7; the bound is 1e-6
     * relative. */
    xent_model_ws *ws = NULL;
    CHECK(xent_model_ws_new(m, 1, n, 0, &ws) == XENT_OK, "%s",
          xent_last_error());
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = 1, o.S = n, o.tokens = ids, o.backward = 0;
    xent_precision p = xent_precision_fp32();
    xent_model_record r;
    CHECK(ws && xent_model_run(m, ws, &p, &o, &r) == XENT_OK, "%s",
          xent_last_error());
    CHECK(ws && fabs(r.loss - 3.461710231) <= 1e-6 * 3.461710231,
          "SmolLM2 loss %.9f, transformers 3.461710231", r.loss);
    xent_model_ws_free(ws);
    free(back), free(ids), free(want);
done:
    xent_model_free(m);
    free(text), free(idtxt);
}

/* SmolLM2's vocabulary and merges under another pre-tokenizer. */
static xent_tokenizer *with_pre(const xent_tokenizer *tk, const char *pre) {
    int64_t n = xent_tokenizer_vocab(tk), nm = xent__tokenizer_n_merges(tk);
    char **toks = malloc((size_t)n * sizeof *toks);
    char **mer = malloc((size_t)nm * sizeof *mer);
    size_t *tl = malloc((size_t)n * sizeof *tl), *ml = malloc((size_t)nm * sizeof *ml);
    int32_t *ty = malloc((size_t)n * sizeof *ty);
    for (int64_t i = 0; i < n; i++) {
        toks[i] = (char *)xent_tokenizer_token(tk, i);
        tl[i] = strlen(toks[i]);
        ty[i] = xent__tokenizer_type(tk, i);
    }
    for (int64_t i = 0; i < nm; i++) {
        mer[i] = (char *)xent__tokenizer_merge(tk, i);
        ml[i] = strlen(mer[i]);
    }
    xent_tokenizer *t = NULL;
    if (xent__tokenizer_new(toks, tl, n, mer, ml, nm, ty, pre, &t)) t = NULL;
    free(toks), free(mer), free(tl), free(ml), free(ty);
    return t;
}

/* The hand-written Llama 3 and Qwen2 pre-tokenizers against the reference
 * library's regex engine (same vocabulary, fixture text). */
TEST(tokenizer_llama3_qwen2_reference_ids) {
    const char *env = getenv("XENT_MODEL_GGUF"), *home = getenv("HOME");
    char path[512];
    if (env) snprintf(path, sizeof path, "%s", env);
    else snprintf(path, sizeof path, "%s/.cache/xent/"
                  "SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "");
    if (access(path, R_OK) != 0) {
        xt_skip("no SmolLM2 GGUF (run `make model` or set XENT_MODEL_GGUF)");
        return;
    }
    xent_model *m = NULL;
    CHECK(xent_model_load_gguf(path, &m) == XENT_OK, "%s", xent_last_error());
    size_t tn = 0;
    char *text = slurp("tests/data/model/tokenizer_text.txt", &tn);
    const char *pre[] = {"llama-bpe", "qwen2"};
    const char *fix[] = {"tests/data/model/tokenizer_ids_llama3.txt",
                         "tests/data/model/tokenizer_ids_qwen2.txt"};
    for (int k = 0; m && m->tok && text && k < 2; k++) {
        size_t in = 0;
        char *idtxt = slurp(fix[k], &in);
        CHECK(idtxt != NULL, "%s missing", fix[k]);
        xent_tokenizer *t = with_pre(m->tok, pre[k]);
        CHECK(t != NULL, "tokenizer");
        if (!idtxt || !t) {
            free(idtxt);
            xent_tokenizer_free(t);
            continue;
        }
        int32_t *want = malloc(in * sizeof *want);
        int64_t nw = 0;
        for (char *p = idtxt, *e; *p; p = e) {
            long v = strtol(p, &e, 10);
            if (e == p) break;
            want[nw++] = (int32_t)v;
        }
        int32_t *ids = NULL;
        int64_t n = 0;
        CHECK(xent_tokenize(t, text, tn, &ids, &n) == XENT_OK, "%s",
              xent_last_error());
        CHECK(n == nw, "%s: %lld ids, reference %lld", pre[k], (long long)n,
              (long long)nw);
        for (int64_t i = 0; i < n && i < nw; i++) {
            CHECK(ids[i] == want[i], "%s: ids[%lld] = %d, reference %d",
                  pre[k], (long long)i, ids[i], want[i]);
            CHECK_LIMIT(5);
        }
        free(ids), free(want), free(idtxt);
        xent_tokenizer_free(t);
    }
    free(text);
    xent_model_free(m);
}
