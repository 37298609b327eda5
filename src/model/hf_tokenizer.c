/* src/model/hf_tokenizer.c: tokenizer.json (Hugging Face tokenizers) ->
 * the byte-level BPE of tokenizer.c. Every count, id and string is checked
 * against the file; what the BPE here cannot reproduce (another model type,
 * an unknown pre-tokenizer or normalizer) is refused with
 * XENT_ERR_UNSUPPORTED naming what it found. Two kinds:
 *   byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM2): ByteLevel pre-tokenizer;
 *   SentencePiece-style BPE (Gemma, Llama 2): byte_fallback, no
 *     pre-tokenizer, the normalizer Replace(" " -> "\u2581"), optionally
 *     after Prepend("\u2581") (tokenizer.c's "spm" and "spm-prepend"). */
#include "model/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_MAX_BYTES ((uint64_t)256 << 20)
#define TOK_MAX_IDS ((int64_t)1 << 24)

/* The split patterns of the pre-tokenizers tokenizer.c implements. */
static const char k_llama3_re[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_qwen2_re[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int str_is(const xent_json_node *n, const char *s) {
    return n && n->type == XENT_JSON_STR && n->len == strlen(s) && !memcmp(n->str, s, n->len);
}

static const xent_json_node *get(const xent_json *j, const xent_json_node *o, const char *k) {
    if (!o || o->type != XENT_JSON_OBJ) return NULL;
    const xent_json_node *n = xent_json_get(j, o, k);
    return n && n->type != XENT_JSON_NULL ? n : NULL;
}

/* A ByteLevel pre-tokenizer as tokenizer.c does it: no prefix space. */
static xent_status byte_level_ok(const xent_json *j, const xent_json_node *n, const char *path) {
    const xent_json_node *ap = get(j, n, "add_prefix_space");
    if (ap && ap->type == XENT_JSON_TRUE)
        return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: pre_tokenizer ByteLevel with "
                              "add_prefix_space = true is not supported", path);
    return XENT_OK;
}

/* pre_tokenizer -> tokenizer.c's name (gguf's tokenizer.ggml.pre). */
static xent_status pre_name(const xent_json *j, const xent_json_node *pt, const char *path,
                            const char **name) {
    if (!pt)
        return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: no pre_tokenizer (not a byte-level "
                              "BPE)", path);
    const xent_json_node *ty = get(j, pt, "type");
    if (str_is(ty, "ByteLevel")) {
        const xent_json_node *ur = get(j, pt, "use_regex");
        if (ur && ur->type == XENT_JSON_FALSE)
            return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: ByteLevel with use_regex = false "
                                  "alone is not supported", path);
        *name = "gpt2";
        return byte_level_ok(j, pt, path);
    }
    if (!str_is(ty, "Sequence"))
        return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: pre_tokenizer type '%.*s' is not "
                              "supported (ByteLevel, or a Sequence of Split/Digits and ByteLevel)",
                              path, ty && ty->type == XENT_JSON_STR ? (int)(ty->len < 40 ? ty->len : 40) : 1,
                              ty && ty->type == XENT_JSON_STR ? ty->str : "?");
    const xent_json_node *ps = get(j, pt, "pretokenizers");
    if (!ps || ps->type != XENT_JSON_ARR)
        return xent_set_error(XENT_ERR_FORMAT, "%s: pre_tokenizer Sequence without "
                              "'pretokenizers'", path);
    int split = 0, digits = 0, bl = 0;
    for (int64_t c = ps->first; c >= 0; c = j->nodes[c].next) {
        const xent_json_node *e = &j->nodes[c];
        const xent_json_node *et = get(j, e, "type");
        if (str_is(et, "ByteLevel")) {
            xent_status st = byte_level_ok(j, e, path);
            if (st) return st;
            const xent_json_node *ur = get(j, e, "use_regex");
            if (ur && ur->type == XENT_JSON_FALSE) bl = 1; /* after a Split */
            else bl = 2;
        } else if (str_is(et, "Digits")) {
            const xent_json_node *id = get(j, e, "individual_digits");
            if (!id || id->type != XENT_JSON_TRUE)
                return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: Digits pre-tokenizer without "
                                      "individual_digits is not supported", path);
            digits = 1;
        } else if (str_is(et, "Split")) {
            const xent_json_node *pat = get(j, get(j, e, "pattern"), "Regex");
            if (!pat || pat->type != XENT_JSON_STR)
                return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: Split pre-tokenizer without a "
                                      "Regex pattern is not supported", path);
            if (str_is(pat, k_llama3_re)) split = 3;
            else if (str_is(pat, k_qwen2_re)) split = 1;
            else
                return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: Split pattern '%.*s' is not "
                                      "one this tokenizer implements (Llama 3's, Qwen2's)", path,
                                      (int)(pat->len < 80 ? pat->len : 80), pat->str);
        } else {
            return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: pre-tokenizer '%.*s' in the "
                                  "Sequence is not supported", path,
                                  et && et->type == XENT_JSON_STR ? (int)(et->len < 40 ? et->len : 40) : 1,
                                  et && et->type == XENT_JSON_STR ? et->str : "?");
        }
    }
    if (split && bl == 1 && !digits) *name = split == 3 ? "llama-bpe" : "qwen2";
    else if (!split && digits && bl == 2) *name = "smollm";
    else if (!split && !digits && bl == 2) *name = "gpt2";
    else
        return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: this combination of pre-tokenizers is "
                              "not supported (Split + ByteLevel without regex; Digits + "
                              "ByteLevel; ByteLevel)", path);
    return XENT_OK;
}

/* U+2581, SentencePiece's word-boundary mark, in UTF-8 */
#define SPM_MARK "\xE2\x96\x81"

/* A Replace normalizer of " " by U+2581. */
static int is_space_to_mark(const xent_json *j, const xent_json_node *n) {
    return str_is(get(j, n, "type"), "Replace") &&
           str_is(get(j, get(j, n, "pattern"), "String"), " ") &&
           str_is(get(j, n, "content"), SPM_MARK);
}

/* The SentencePiece-style forms tokenizer.c implements: byte_fallback, no
 * pre-tokenizer, and the normalizer Replace(" " -> U+2581) ("spm", Gemma)
 * or Sequence[Prepend(U+2581), Replace(...)] ("spm-prepend", Llama 2). */
static xent_status spm_name(const xent_json *j, const xent_json_node *nz,
                            const xent_json_node *pt, const char *path, const char **name) {
    if (pt)
        return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: model.byte_fallback = true with a "
                              "pre_tokenizer (e.g. Metaspace) is not supported (the "
                              "SentencePiece-style form here has none)", path);
    if (nz && is_space_to_mark(j, nz)) {
        *name = "spm";
        return XENT_OK;
    }
    const xent_json_node *ns = nz && str_is(get(j, nz, "type"), "Sequence")
                                   ? get(j, nz, "normalizers") : NULL;
    if (ns && ns->type == XENT_JSON_ARR && ns->count == 2) {
        const xent_json_node *a = &j->nodes[ns->first], *b = &j->nodes[a->next];
        if (str_is(get(j, a, "type"), "Prepend") && str_is(get(j, a, "prepend"), SPM_MARK) &&
            is_space_to_mark(j, b)) {
            *name = "spm-prepend";
            return XENT_OK;
        }
    }
    return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: model.byte_fallback = true needs the "
                          "normalizer Replace(' ' -> U+2581), alone or after Prepend(U+2581); "
                          "this file has another", path);
}

typedef struct {
    char **tok;
    size_t *len;
    int32_t *type;
    int64_t n;
    char **mer;
    size_t *ml;
    int64_t nm;
} tok_arrays;

static void arrays_free(tok_arrays *a) {
    if (a->mer)
        for (int64_t i = 0; i < a->nm; i++) free(a->mer[i]);
    free(a->tok), free(a->len), free(a->type), free(a->mer), free(a->ml);
}

/* An id member: an integer in [0, TOK_MAX_IDS). */
static int id_of(const xent_json_node *n, int64_t *id) {
    return n && n->type == XENT_JSON_NUM && xent_json_uint(n, id) && *id < TOK_MAX_IDS;
}

static xent_status from_json(const xent_json *j, const char *path, xent_tokenizer **out) {
    const xent_json_node *r = &j->nodes[0];
    if (r->type != XENT_JSON_OBJ)
        return xent_set_error(XENT_ERR_FORMAT, "%s: the top level is not a JSON object", path);
    const xent_json_node *model = get(j, r, "model");
    if (!model || model->type != XENT_JSON_OBJ)
        return xent_set_error(XENT_ERR_FORMAT, "%s: 'model' is missing or not an object", path);
    const xent_json_node *mt = get(j, model, "type");
    if (mt && !str_is(mt, "BPE"))
        return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: model.type '%.*s' is not supported "
                              "(BPE)", path, mt->type == XENT_JSON_STR ? (int)(mt->len < 40 ? mt->len : 40) : 1,
                              mt->type == XENT_JSON_STR ? mt->str : "?");
    const xent_json_node *bf = get(j, model, "byte_fallback");
    const xent_json_node *nz = get(j, r, "normalizer");
    const char *pre = NULL;
    xent_status st;
    if (bf && bf->type == XENT_JSON_TRUE) {
        st = spm_name(j, nz, get(j, r, "pre_tokenizer"), path, &pre);
    } else {
        if (nz && !str_is(get(j, nz, "type"), "NFC"))
            return xent_set_error(XENT_ERR_UNSUPPORTED, "%s: a normalizer other than NFC is not "
                                  "supported with a byte-level BPE", path);
        st = pre_name(j, get(j, r, "pre_tokenizer"), path, &pre);
    }
    if (st) return st;
    const xent_json_node *vocab = get(j, model, "vocab");
    const xent_json_node *merges = get(j, model, "merges");
    if (!vocab || vocab->type != XENT_JSON_OBJ)
        return xent_set_error(XENT_ERR_FORMAT, "%s: model.vocab is missing or not an object", path);
    if (!merges || merges->type != XENT_JSON_ARR)
        return xent_set_error(XENT_ERR_FORMAT, "%s: model.merges is missing or not a list", path);
    const xent_json_node *added = get(j, r, "added_tokens");
    if (added && added->type != XENT_JSON_ARR)
        return xent_set_error(XENT_ERR_FORMAT, "%s: added_tokens is not a list", path);
    /* n = 1 + the largest id */
    int64_t n = 0, id;
    for (int64_t c = vocab->first; c >= 0; c = j->nodes[c].next) {
        if (!id_of(&j->nodes[c], &id))
            return xent_set_error(XENT_ERR_FORMAT, "%s: model.vocab['%.*s'] is not a token id in "
                                  "[0, %lld)", path, (int)(j->nodes[c].key_len < 64 ? j->nodes[c].key_len : 64),
                                  j->nodes[c].key, (long long)TOK_MAX_IDS);
        n = id + 1 > n ? id + 1 : n;
    }
    int64_t k = 0;
    for (int64_t c = added ? added->first : -1; c >= 0; c = j->nodes[c].next, k++) {
        const xent_json_node *e = &j->nodes[c];
        const xent_json_node *content = get(j, e, "content");
        if (!id_of(get(j, e, "id"), &id) || !content || content->type != XENT_JSON_STR)
            return xent_set_error(XENT_ERR_FORMAT, "%s: added_tokens[%lld] needs an 'id' in [0, "
                                  "%lld) and a string 'content'", path, (long long)k,
                                  (long long)TOK_MAX_IDS);
        n = id + 1 > n ? id + 1 : n;
    }
    if (n == 0) return xent_set_error(XENT_ERR_FORMAT, "%s: the vocabulary is empty", path);
    tok_arrays a = {0};
    a.n = n;
    a.nm = merges->count;
    a.tok = calloc((size_t)n, sizeof *a.tok);
    a.len = calloc((size_t)n, sizeof *a.len);
    a.type = calloc((size_t)n, sizeof *a.type);
    a.mer = calloc((size_t)(a.nm ? a.nm : 1), sizeof *a.mer);
    a.ml = calloc((size_t)(a.nm ? a.nm : 1), sizeof *a.ml);
    if (!a.tok || !a.len || !a.type || !a.mer || !a.ml) {
        arrays_free(&a);
        return xent_set_error(XENT_ERR_ALLOC, "%s: %lld tokens", path, (long long)n);
    }
    for (int64_t c = vocab->first; c >= 0; c = j->nodes[c].next) {
        const xent_json_node *e = &j->nodes[c];
        id_of(e, &id);
        if (a.tok[id]) {
            st = xent_set_error(XENT_ERR_FORMAT, "%s: model.vocab gives id %lld to two tokens",
                                path, (long long)id);
            break;
        }
        a.tok[id] = (char *)e->key;
        a.len[id] = e->key_len;
        a.type[id] = 1;
    }
    for (int64_t c = added ? added->first : -1; !st && c >= 0; c = j->nodes[c].next) {
        const xent_json_node *e = &j->nodes[c];
        const xent_json_node *content = get(j, e, "content"), *sp = get(j, e, "special");
        id_of(get(j, e, "id"), &id);
        a.tok[id] = (char *)content->str; /* an added token overrides the vocab's */
        a.len[id] = content->len;
        a.type[id] = sp && sp->type == XENT_JSON_TRUE ? 3 : 4;
    }
    for (id = 0; !st && id < n; id++)
        if (!a.tok[id])
            st = xent_set_error(XENT_ERR_FORMAT, "%s: no token has id %lld (ids must run from 0 "
                                "to %lld without a gap)", path, (long long)id, (long long)(n - 1));
    k = 0;
    for (int64_t c = merges->first; !st && c >= 0; c = j->nodes[c].next, k++) {
        const xent_json_node *e = &j->nodes[c];
        if (e->type == XENT_JSON_STR) {
            a.mer[k] = malloc(e->len + 1);
            if (!a.mer[k]) break;
            memcpy(a.mer[k], e->str, e->len);
            a.mer[k][e->len] = 0;
            a.ml[k] = e->len;
        } else if (e->type == XENT_JSON_ARR && e->count == 2 &&
                   j->nodes[e->first].type == XENT_JSON_STR &&
                   j->nodes[j->nodes[e->first].next].type == XENT_JSON_STR) {
            const xent_json_node *l = &j->nodes[e->first], *rr = &j->nodes[l->next];
            a.ml[k] = l->len + 1 + rr->len;
            a.mer[k] = malloc(a.ml[k] + 1);
            if (!a.mer[k]) break;
            memcpy(a.mer[k], l->str, l->len);
            a.mer[k][l->len] = ' ';
            memcpy(a.mer[k] + l->len + 1, rr->str, rr->len);
            a.mer[k][a.ml[k]] = 0;
        } else {
            st = xent_set_error(XENT_ERR_FORMAT, "%s: model.merges[%lld] is neither \"a b\" nor "
                                "[\"a\", \"b\"]", path, (long long)k);
        }
    }
    if (!st && k < a.nm) st = xent_set_error(XENT_ERR_ALLOC, "%s: merges", path);
    if (!st)
        st = xent__tokenizer_new(a.tok, a.len, n, a.mer, a.ml, a.nm, a.type, pre, out);
    arrays_free(&a);
    return st;
}

xent_status xent_tokenizer_from_json(const char *text, size_t len, const char *path,
                                     xent_tokenizer **out) {
    if (!text || !out) return xent_set_error(XENT_ERR_NULL, "tokenizer_from_json: NULL");
    if (!path) path = "tokenizer.json";
    xent_json j;
    xent_status st = xent_json_parse(text, len, path, &j);
    if (st) return st;
    st = from_json(&j, path, out);
    xent_json_free(&j);
    return st;
}

xent_status xent_tokenizer_load_json(const char *path, xent_tokenizer **out) {
    if (!path || !out) return xent_set_error(XENT_ERR_NULL, "tokenizer_load_json: NULL");
    char *p = NULL;
    size_t n = 0;
    xent_status rs = xent__read_small_file(path, TOK_MAX_BYTES, &p, &n);
    if (rs) return rs;
    xent_status st = xent_tokenizer_from_json(p, n, path, out);
    free(p);
    return st;
}
