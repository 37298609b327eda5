/* src/model/tokenizer.c: GPT-2 style byte-level BPE (SmolLM2, Llama 3,
 * Qwen2) from the vocabulary and merges stored in GGUF or tokenizer.json,
 * and SentencePiece-style BPE with byte fallback (Gemma, Llama 2) from
 * tokenizer.json.
 *
 * encode: split out special tokens (GGUF token types CONTROL and
 * USER_DEFINED), then for each remaining piece
 *   byte-level: pre-tokenize with the model's pre-tokenizer (the regexes
 *     below, matched by hand on code points), map every byte of a chunk to
 *     its GPT-2 unicode symbol, then merge the adjacent pair of lowest merge
 *     rank until none is left;
 *   SentencePiece-style ("spm", "spm-prepend"): replace each space by U+2581
 *     (after prepending one U+2581 for "spm-prepend"), start from the UTF-8
 *     characters of the whole piece and merge as above; a final symbol that
 *     is not in the vocabulary becomes its bytes' <0xXX> tokens. */
#include "model/model_internal.h"
#include "model/unicode_tables.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PRE_GPT2, PRE_SMOLLM, PRE_LLAMA3, PRE_QWEN2, PRE_SPM, PRE_SPM_PREPEND };

typedef struct {
    char **keys;   /* [cap] NUL-terminated, NULL = empty                    */
    size_t *lens;  /* [cap] key lengths                                     */
    int64_t *vals; /* [cap]                                                 */
    int64_t cap;
} strmap;

struct xent_tokenizer {
    int64_t n;          /* vocabulary size                                  */
    char **tok;         /* [n] token strings (GPT-2 unicode form)           */
    int32_t *type;      /* [n] GGUF token types (1 normal, 3 control, ...)  */
    int64_t n_merges;
    char **merge;       /* [n_merges] "left right"                          */
    strmap vocab;       /* token string -> id                               */
    strmap ranks;       /* "left right" -> rank                             */
    int64_t *special;   /* ids of special tokens, longest first             */
    int64_t n_special;
    strmap spmap;       /* special token string -> id (lowest id wins)      */
    int64_t *splen;     /* distinct special lengths by first byte, longest
                           first: splen[spoff[b] .. spoff[b + 1])           */
    int64_t spoff[257];
    char sym[256][4];   /* byte -> UTF-8 of its unicode symbol (NUL-term.)  */
    int16_t unsym[324]; /* code point (< 324) -> byte, -1 none              */
    int pre;
    char pre_name[64];
};

/* ---- string map --------------------------------------------------------- */

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int map_init(strmap *m, int64_t n) {
    m->cap = 16;
    while (m->cap < 2 * n + 16) m->cap *= 2;
    m->keys = calloc((size_t)m->cap, sizeof *m->keys);
    m->vals = calloc((size_t)m->cap, sizeof *m->vals);
    m->lens = calloc((size_t)m->cap, sizeof *m->lens);
    return m->keys && m->vals && m->lens;
}

static void map_free(strmap *m) {
    for (int64_t i = 0; m->keys && i < m->cap; i++) free(m->keys[i]);
    free(m->keys), free(m->vals), free(m->lens);
}

/* Inserts (first insertion wins); key copied. 0 on allocation failure. */
static int map_put(strmap *m, const char *k, size_t n, int64_t v) {
    uint64_t i = fnv(k, n) & (uint64_t)(m->cap - 1);
    while (m->keys[i]) {
        if (m->lens[i] == n && !memcmp(m->keys[i], k, n)) return 1;
        i = (i + 1) & (uint64_t)(m->cap - 1);
    }
    m->keys[i] = malloc(n + 1);
    if (!m->keys[i]) return 0;
    memcpy(m->keys[i], k, n);
    m->keys[i][n] = 0;
    m->lens[i] = n;
    m->vals[i] = v;
    return 1;
}

static int64_t map_get(const strmap *m, const char *k, size_t n) {
    uint64_t i = fnv(k, n) & (uint64_t)(m->cap - 1);
    while (m->keys[i]) {
        if (m->lens[i] == n && !memcmp(m->keys[i], k, n)) return m->vals[i];
        i = (i + 1) & (uint64_t)(m->cap - 1);
    }
    return -1;
}

/* ---- unicode ------------------------------------------------------------ */

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t c) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < r[mid][0]) hi = mid;
        else if (c > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}
static int is_L(uint32_t c) {
    if (c < 128) return (c | 32) >= 'a' && (c | 32) <= 'z';
    return in_ranges(xent__uni_L, sizeof xent__uni_L / sizeof xent__uni_L[0],
                     c);
}
static int is_N(uint32_t c) {
    if (c < 128) return c >= '0' && c <= '9';
    return in_ranges(xent__uni_N, sizeof xent__uni_N / sizeof xent__uni_N[0],
                     c);
}
/* Unicode White_Space (what \s matches in the reference regex engines). */
static int is_S(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
static int is_nl(uint32_t c) { return c == '\r' || c == '\n'; }

/* Decodes UTF-8; an invalid byte becomes one "code point" 0xDC00 + byte
 * (matched as "other", its byte kept). cp/off: [len + 1]. */
static int64_t utf8_decode(const unsigned char *s, int64_t len, uint32_t *cp,
                           int64_t *off) {
    int64_t n = 0, i = 0;
    while (i < len) {
        unsigned char b = s[i];
        int k = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3
                : (b >> 3) == 30 ? 4 : 0;
        uint32_t c = k == 1 ? b : k == 2 ? b & 31u : k == 3 ? b & 15u : b & 7u;
        int ok = k > 0 && i + k <= len;
        for (int j = 1; ok && j < k; j++) {
            ok = (s[i + j] & 0xC0) == 0x80;
            c = (c << 6) | (s[i + j] & 63u);
        }
        if (ok && ((k == 2 && c < 0x80) || (k == 3 && c < 0x800) ||
                   (k == 4 && (c < 0x10000 || c > 0x10FFFF)) ||
                   (c >= 0xD800 && c <= 0xDFFF)))
            ok = 0;
        if (!ok) k = 1, c = 0xDC00u + b;
        off[n] = i;
        cp[n++] = c;
        i += k;
    }
    off[n] = len;
    return n;
}

/* ---- pre-tokenizer regexes ---------------------------------------------- */

/* 's 't 're 've 'm 'll 'd at i (ci: case-insensitive); 0 if none. */
static int64_t contraction(const uint32_t *c, int64_t i, int64_t n, int ci) {
    if (c[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = c[i + 1], b = i + 2 < n ? c[i + 2] : 0;
    if (ci) {
        a = a < 128 ? (a | 32) : a;
        b = b < 128 ? (b | 32) : b;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') ||
        (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

static int is_other(uint32_t c) { return !is_S(c) && !is_L(c) && !is_N(c); }

/* \s+(?!\S) then \s+ (the two whitespace alternatives). */
static int64_t ws_tail(const uint32_t *c, int64_t i, int64_t n) {
    int64_t k = i;
    while (k < n && is_S(c[k])) k++;
    if (k == i) return 0;
    if (k == n || k - i == 1) return k - i;
    return k - i - 1;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
 * \s+(?!\S)|\s+ */
static int64_t match_gpt2(const uint32_t *c, int64_t i, int64_t n) {
    int64_t m = contraction(c, i, n, 0);
    if (m) return m;
    int64_t j = i + (c[i] == ' ' && i + 1 < n);
    int (*cls[3])(uint32_t) = {is_L, is_N, is_other};
    for (int a = 0; a < 3; a++) {
        int64_t k = j;
        while (k < n && cls[a](c[k])) k++;
        if (k > j) return k - i;
        /* without the optional space */
        if (j != i) {
            k = i;
            while (k < n && cls[a](c[k])) k++;
            if (k > i) return k - i;
        }
    }
    return ws_tail(c, i, n);
}

/* Llama 3 (digits = 3) / Qwen2 (digits = 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static int64_t match_llama3(const uint32_t *c, int64_t i, int64_t n,
                            int digits) {
    int64_t m = contraction(c, i, n, 1);
    if (m) return m;
    int64_t j = i + (!is_nl(c[i]) && !is_L(c[i]) && !is_N(c[i]) && i + 1 < n &&
                     is_L(c[i + 1]));
    int64_t k = j;
    while (k < n && is_L(c[k])) k++;
    if (k > j) return k - i;
    k = i;
    while (k < n && k - i < digits && is_N(c[k])) k++;
    if (k > i) return k - i;
    j = i + (c[i] == ' ' && i + 1 < n && is_other(c[i + 1]));
    k = j;
    while (k < n && is_other(c[k])) k++;
    if (k > j) {
        while (k < n && is_nl(c[k])) k++;
        return k - i;
    }
    k = i;
    int64_t last_nl = -1;
    while (k < n && is_S(c[k])) {
        if (is_nl(c[k])) last_nl = k;
        k++;
    }
    if (last_nl >= 0) return last_nl + 1 - i;
    return ws_tail(c, i, n);
}

/* ---- construction ------------------------------------------------------- */

static void byte_symbols(xent_tokenizer *t) {
    int next = 256;
    for (int i = 0; i < 324; i++) t->unsym[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) ||
                   (b >= 174 && b <= 255);
        int cp = keep ? b : next++;
        t->unsym[cp] = (int16_t)b;
        if (cp < 128) {
            t->sym[b][0] = (char)cp;
            t->sym[b][1] = 0;
        } else {
            t->sym[b][0] = (char)(0xC0 | (cp >> 6));
            t->sym[b][1] = (char)(0x80 | (cp & 63));
            t->sym[b][2] = 0;
        }
    }
}

void xent_tokenizer_free(xent_tokenizer *t) {
    if (!t) return;
    for (int64_t i = 0; t->tok && i < t->n; i++) free(t->tok[i]);
    for (int64_t i = 0; t->merge && i < t->n_merges; i++) free(t->merge[i]);
    free(t->tok), free(t->type), free(t->merge), free(t->special), free(t->splen);
    map_free(&t->spmap);
    map_free(&t->vocab);
    map_free(&t->ranks);
    free(t);
}

/* Special tokens ordered longest first, then by id (the longest match
 * wins; among equal strings the lowest id). */
typedef struct { size_t len; int64_t id; } spkey;
static int spkey_cmp(const void *a, const void *b) {
    const spkey *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Sorts the special tokens once (O(n log n)) and indexes them: a map from
 * string to id and, per first byte, the distinct lengths longest first, so
 * matching at a text position looks up one hash per distinct length of the
 * specials that start with that byte instead of comparing every special.
 * Returns 0, or 1 when out of memory. */
static int special_index(xent_tokenizer *t) {
    int64_t n = t->n_special;
    spkey *k = malloc((size_t)(n ? n : 1) * sizeof *k);
    t->splen = malloc((size_t)(n ? n : 1) * sizeof *t->splen);
    if (!k || !t->splen || !map_init(&t->spmap, n)) {
        free(k);
        return 1;
    }
    int ok = 1;
    /* t->special is in id order here: the lowest id of a repeated string
     * enters the map first and wins */
    for (int64_t i = 0; i < n; i++) {
        k[i] = (spkey){strlen(t->tok[t->special[i]]), t->special[i]};
        if (ok) ok = map_put(&t->spmap, t->tok[t->special[i]], k[i].len, t->special[i]);
    }
    qsort(k, (size_t)n, sizeof *k, spkey_cmp);
    int64_t cnt[256] = {0};
    int64_t last[256];
    for (int b = 0; b < 256; b++) last[b] = -1;
    for (int64_t i = 0; i < n; i++) {
        t->special[i] = k[i].id;
        unsigned char b = (unsigned char)t->tok[k[i].id][0];
        if (last[b] != (int64_t)k[i].len) cnt[b]++, last[b] = (int64_t)k[i].len;
    }
    t->spoff[0] = 0;
    for (int b = 0; b < 256; b++) t->spoff[b + 1] = t->spoff[b] + cnt[b];
    int64_t fill[256];
    for (int b = 0; b < 256; b++) fill[b] = t->spoff[b], last[b] = -1;
    for (int64_t i = 0; i < n && ok; i++) {
        const char *sp = t->tok[k[i].id];
        unsigned char b = (unsigned char)sp[0];
        if (last[b] != (int64_t)k[i].len) t->splen[fill[b]++] = last[b] = (int64_t)k[i].len;
    }
    free(k);
    return !ok;
}

static int pre_kind(const char *pre) {
    if (!strcmp(pre, "smollm") || !strcmp(pre, "starcoder") ||
        !strcmp(pre, "refact"))
        return PRE_SMOLLM;
    if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") ||
        !strcmp(pre, "smaug-bpe"))
        return PRE_LLAMA3;
    if (!strcmp(pre, "qwen2")) return PRE_QWEN2;
    if (!strcmp(pre, "spm")) return PRE_SPM;
    if (!strcmp(pre, "spm-prepend")) return PRE_SPM_PREPEND;
    return PRE_GPT2;
}

xent_status xent__tokenizer_new(char **tokens, const size_t *tok_len,
                                int64_t n, char **merges,
                                const size_t *merge_len, int64_t nm,
                                const int32_t *types, const char *pre,
                                xent_tokenizer **out) {
    xent_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return xent_set_error(XENT_ERR_ALLOC, "tokenizer");
    t->n = n;
    t->n_merges = nm;
    t->tok = calloc((size_t)n + 1, sizeof *t->tok);
    t->type = calloc((size_t)n + 1, sizeof *t->type);
    t->merge = calloc((size_t)nm + 1, sizeof *t->merge);
    t->special = calloc((size_t)n + 1, sizeof *t->special);
    int ok = t->tok && t->type && t->merge && t->special &&
             map_init(&t->vocab, n) && map_init(&t->ranks, nm);
    for (int64_t i = 0; ok && i < n; i++) {
        t->tok[i] = malloc(tok_len[i] + 1);
        ok = t->tok[i] != NULL;
        if (!ok) break;
        memcpy(t->tok[i], tokens[i], tok_len[i]);
        t->tok[i][tok_len[i]] = 0;
        t->type[i] = types ? types[i] : 1;
        ok = map_put(&t->vocab, tokens[i], tok_len[i], i);
        /* a special token is matched as a C string: one holding a NUL
         * byte (or empty) could match the empty string and never advance */
        if ((t->type[i] == 3 || t->type[i] == 4) && tok_len[i] > 0 &&
            !memchr(tokens[i], 0, tok_len[i]))
            t->special[t->n_special++] = i;
    }
    for (int64_t i = 0; ok && i < nm; i++) {
        t->merge[i] = malloc(merge_len[i] + 1);
        ok = t->merge[i] != NULL;
        if (!ok) break;
        memcpy(t->merge[i], merges[i], merge_len[i]);
        t->merge[i][merge_len[i]] = 0;
        ok = map_put(&t->ranks, merges[i], merge_len[i], i);
    }
    if (!ok) {
        xent_tokenizer_free(t);
        return xent_set_error(XENT_ERR_ALLOC, "tokenizer: %lld tokens",
                          (long long)n);
    }
    if (special_index(t)) {
        xent_tokenizer_free(t);
        return xent_set_error(XENT_ERR_ALLOC, "tokenizer: %lld special tokens",
                              (long long)n);
    }
    byte_symbols(t);
    snprintf(t->pre_name, sizeof t->pre_name, "%s", pre ? pre : "default");
    t->pre = pre_kind(t->pre_name);
    *out = t;
    return XENT_OK;
}

int64_t xent_tokenizer_vocab(const xent_tokenizer *tk) { return tk ? tk->n : 0; }
const char *xent_tokenizer_pre(const xent_tokenizer *tk) {
    return tk ? tk->pre_name : "";
}
const char *xent_tokenizer_token(const xent_tokenizer *tk, int64_t id) {
    return (tk && id >= 0 && id < tk->n) ? tk->tok[id] : NULL;
}
int64_t xent__tokenizer_n_merges(const xent_tokenizer *tk) {
    return tk->n_merges;
}
const char *xent__tokenizer_merge(const xent_tokenizer *tk, int64_t i) {
    return tk->merge[i];
}
int32_t xent__tokenizer_type(const xent_tokenizer *tk, int64_t i) {
    return tk->type[i];
}

/* ---- encoding ----------------------------------------------------------- */

typedef struct {
    int32_t *ids;
    int64_t n, cap;
} idvec;

static int push(idvec *v, int32_t id) {
    if (v->n == v->cap) {
        int64_t c = v->cap ? v->cap * 2 : 256;
        int32_t *p = realloc(v->ids, (size_t)c * sizeof *p);
        if (!p) return 0;
        v->ids = p, v->cap = c;
    }
    v->ids[v->n++] = id;
    return 1;
}

/* A candidate merge: adjacent symbols `left` and nx[left] whose "l r" has
 * merge rank `rank`; `size` = their total byte length when queued. Symbols
 * only ever grow, so an entry is stale exactly when `left` is gone, its right
 * neighbour changed, or the two no longer add up to `size`. */
typedef struct {
    int64_t rank, left, size;
} bpe_cand;

/* Heap order: lower rank first, then the leftmost pair (the order of the
 * rescan this replaces: among equal ranks the leftmost pair merges). */
static int cand_before(const bpe_cand *a, const bpe_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(bpe_cand *h, int64_t *n, bpe_cand c) {
    int64_t i = (*n)++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!cand_before(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, int64_t *n) {
    bpe_cand top = h[0], last = h[--*n];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_before(&h[c + 1], &h[c])) c++;
        if (!cand_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* Merge rank of the adjacent symbols a, b (-1: no such merge). */
static int64_t pair_rank(const xent_tokenizer *t, const char *buf,
                         const int64_t *st, const int64_t *ln, int64_t a,
                         int64_t b, char *key) {
    memcpy(key, buf + st[a], (size_t)ln[a]);
    key[ln[a]] = ' ';
    memcpy(key + ln[a] + 1, buf + st[b], (size_t)ln[b]);
    return map_get(&t->ranks, key, (size_t)(ln[a] + 1 + ln[b]));
}

/* Queues the pair (a, b) if it has a merge rank. */
static void queue_pair(const xent_tokenizer *t, const char *buf,
                       const int64_t *st, const int64_t *ln, int64_t a,
                       int64_t b, char *key, bpe_cand *h, int64_t *nh) {
    int64_t r = pair_rank(t, buf, st, ln, a, b, key);
    if (r >= 0) heap_push(h, nh, (bpe_cand){r, a, ln[a] + ln[b]});
}

/* BPE of one pre-token chunk (raw bytes s[0..len)): repeatedly merges the
 * adjacent pair of lowest rank (leftmost among equals). Symbols form a doubly
 * linked list over their starting byte order; candidate pairs sit in a
 * min-heap and stale ones are dropped when they surface, so a chunk of n
 * bytes takes O(n log n) and O(n) memory: at most n - 1 pairs are queued at
 * the start and two per merge, for at most n - 1 merges. */
static xent_status bpe_chunk(const xent_tokenizer *t, const unsigned char *s,
                             int64_t len, idvec *out) {
    size_t cap = (size_t)len * 2 + 1;
    size_t nsym = (size_t)len + 1;
    char *buf = malloc(cap);                       /* symbol bytes         */
    char *key = malloc(cap + 2);                   /* "left right"         */
    int64_t *st = malloc(nsym * sizeof *st);       /* [len] symbol starts  */
    int64_t *ln = malloc(nsym * sizeof *ln);       /* [len] lengths, 0 gone */
    int64_t *pv = malloc(nsym * sizeof *pv);       /* [len] previous, -1   */
    int64_t *nx = malloc(nsym * sizeof *nx);       /* [len] next, -1       */
    bpe_cand *h = malloc(3 * nsym * sizeof *h);    /* [3 len] heap         */
    xent_status rc = XENT_OK;
    if (!buf || !key || !st || !ln || !pv || !nx || !h) {
        rc = xent_set_error(XENT_ERR_ALLOC, "tokenizer: chunk of %lld bytes",
                        (long long)len);
        goto done;
    }
    const int spm = t->pre >= PRE_SPM;
    int64_t pos = 0;
    for (int64_t i = 0; i < len; i++) {
        /* byte-level: every byte its GPT-2 symbol; SentencePiece-style: the
         * bytes themselves, a UTF-8 continuation byte joined to its lead
         * (symbol i then holds the character starting at byte i, and the
         * continuation bytes' slots are empty: ln 0, out of the list) */
        const char *y = t->sym[s[i]];
        size_t k = spm ? 1 : strlen(y);
        memcpy(buf + pos, spm ? (const char *)s + i : y, k);
        st[i] = pos;
        ln[i] = (int64_t)k;
        pv[i] = i - 1;
        nx[i] = i + 1 < len ? i + 1 : -1;
        pos += (int64_t)k;
    }
    buf[pos] = 0;
    if (spm) /* join continuation bytes (10xxxxxx) to the symbol before */
        for (int64_t i = 1; i < len; i++) {
            if ((s[i] & 0xC0) != 0x80) continue;
            int64_t a = pv[i];
            ln[a] += ln[i];
            ln[i] = 0;
            nx[a] = nx[i];
            if (nx[a] >= 0) pv[nx[a]] = a;
        }
    /* Llama 3's tokenizer ignores merges for a chunk that is a token */
    int64_t whole = t->pre == PRE_LLAMA3 && pos > 0
                        ? map_get(&t->vocab, buf, (size_t)pos)
                        : -1;
    if (whole >= 0) {
        if (!push(out, (int32_t)whole))
            rc = xent_set_error(XENT_ERR_ALLOC, "tokenizer: ids");
        goto done;
    }
    int64_t nh = 0;
    for (int64_t i = len > 0 ? 0 : -1; i >= 0 && nx[i] >= 0; i = nx[i])
        queue_pair(t, buf, st, ln, i, nx[i], key, h, &nh);
    while (nh > 0) {
        bpe_cand c = heap_pop(h, &nh);
        int64_t a = c.left, b = nx[a];
        if (ln[a] == 0 || b < 0 || ln[a] + ln[b] != c.size) continue;
        /* symbols are contiguous in buf: merging = extending the length */
        ln[a] += ln[b];
        ln[b] = 0;
        nx[a] = nx[b];
        if (nx[a] >= 0) pv[nx[a]] = a;
        if (pv[a] >= 0) queue_pair(t, buf, st, ln, pv[a], a, key, h, &nh);
        if (nx[a] >= 0) queue_pair(t, buf, st, ln, a, nx[a], key, h, &nh);
    }
    /* symbol 0 is never merged into a left neighbour: it heads the list */
    for (int64_t i = len > 0 ? 0 : -1; i >= 0 && !rc; i = nx[i]) {
        int64_t id = map_get(&t->vocab, buf + st[i], (size_t)ln[i]);
        if (id < 0 && spm) { /* byte fallback: <0xXX> for each byte */
            for (int64_t b = 0; b < ln[i] && !rc; b++) {
                char bt[8];
                snprintf(bt, sizeof bt, "<0x%02X>", (unsigned char)buf[st[i] + b]);
                int64_t bid = map_get(&t->vocab, bt, 6);
                if (bid < 0)
                    rc = xent_set_error(XENT_ERR_VALUE, "tokenizer: symbol '%.*s' is not in "
                                        "the vocabulary, nor its byte token %s", (int)ln[i],
                                        buf + st[i], bt);
                else if (!push(out, (int32_t)bid))
                    rc = xent_set_error(XENT_ERR_ALLOC, "tokenizer: ids");
            }
            continue;
        }
        if (id < 0)
            rc = xent_set_error(XENT_ERR_VALUE, "tokenizer: symbol '%.*s' is not "
                            "in the vocabulary", (int)ln[i], buf + st[i]);
        else if (!push(out, (int32_t)id))
            rc = xent_set_error(XENT_ERR_ALLOC, "tokenizer: ids");
    }
done:
    free(buf), free(key), free(st), free(ln), free(pv), free(nx), free(h);
    return rc;
}

/* SentencePiece-style: the piece normalized (U+2581 for each space, one
 * before the piece for "spm-prepend") and merged as one chunk. */
static xent_status encode_spm(const xent_tokenizer *t, const unsigned char *s,
                              int64_t len, idvec *out) {
    int64_t sp = 0;
    for (int64_t i = 0; i < len; i++) sp += s[i] == ' ';
    const int64_t n = len + 2 * sp + (t->pre == PRE_SPM_PREPEND ? 3 : 0);
    unsigned char *b = malloc((size_t)n + 1); /* [n] normalized piece */
    if (!b) return xent_set_error(XENT_ERR_ALLOC, "tokenizer: piece of %lld bytes", (long long)len);
    int64_t k = 0;
    if (t->pre == PRE_SPM_PREPEND) memcpy(b, "\xE2\x96\x81", 3), k = 3;
    for (int64_t i = 0; i < len; i++) {
        if (s[i] == ' ') memcpy(b + k, "\xE2\x96\x81", 3), k += 3;
        else b[k++] = s[i];
    }
    xent_status st = bpe_chunk(t, b, k, out);
    free(b);
    return st;
}

/* Pre-tokenizes and encodes a piece without special tokens. */
static xent_status encode_piece(const xent_tokenizer *t, const unsigned char *s,
                                int64_t len, idvec *out) {
    if (len == 0) return XENT_OK;
    if (t->pre >= PRE_SPM) return encode_spm(t, s, len, out);
    uint32_t *cp = malloc((size_t)(len + 1) * sizeof *cp);  /* [len] */
    int64_t *off = malloc((size_t)(len + 1) * sizeof *off); /* [len+1] */
    if (!cp || !off) {
        free(cp), free(off);
        return xent_set_error(XENT_ERR_ALLOC, "tokenizer: piece");
    }
    int64_t n = utf8_decode(s, len, cp, off);
    xent_status st = XENT_OK;
    int64_t i = 0;
    while (i < n && !st) {
        int64_t end = n;
        if (t->pre == PRE_SMOLLM) {
            /* Digits(individual) first: a digit is its own chunk, and the
             * GPT-2 regex runs on the text between digits */
            if (is_N(cp[i])) {
                st = bpe_chunk(t, s + off[i], off[i + 1] - off[i], out);
                i++;
                continue;
            }
            end = i;
            while (end < n && !is_N(cp[end])) end++;
        }
        int64_t m;
        if (t->pre == PRE_LLAMA3) m = match_llama3(cp, i, end, 3);
        else if (t->pre == PRE_QWEN2) m = match_llama3(cp, i, end, 1);
        else m = match_gpt2(cp, i, end);
        if (m <= 0) m = 1;
        st = bpe_chunk(t, s + off[i], off[i + m] - off[i], out);
        i += m;
    }
    free(cp), free(off);
    return st;
}

xent_status xent_tokenize(const xent_tokenizer *t, const char *text,
                          size_t len, int32_t **ids, int64_t *n) {
    if (!t || (!text && len) || !ids || !n)
        return xent_set_error(XENT_ERR_NULL, "tokenize: NULL argument");
    idvec v = {0};
    const unsigned char *s = (const unsigned char *)text;
    size_t start = 0, i = 0;
    xent_status st = XENT_OK;
    while (i < len && !st) {
        int64_t hit = -1;
        size_t hl = 0;
        for (int64_t k = t->spoff[s[i]]; k < t->spoff[s[i] + 1]; k++) {
            size_t l = (size_t)t->splen[k];
            if (l > len - i) continue;
            int64_t id = map_get(&t->spmap, (const char *)s + i, l);
            if (id >= 0) {
                hit = id;
                hl = l;
                break;
            }
        }
        if (hit < 0) {
            i++;
            continue;
        }
        st = encode_piece(t, s + start, (int64_t)(i - start), &v);
        if (!st && !push(&v, (int32_t)hit))
            st = xent_set_error(XENT_ERR_ALLOC, "tokenizer: ids");
        i += hl;
        start = i;
    }
    if (!st) st = encode_piece(t, s + start, (int64_t)(len - start), &v);
    if (st) {
        free(v.ids);
        return st;
    }
    if (!v.ids) v.ids = malloc(sizeof *v.ids);
    *ids = v.ids;
    *n = v.n;
    return XENT_OK;
}

xent_status xent_detokenize(const xent_tokenizer *t, const int32_t *ids,
                            int64_t n, char **text, size_t *len) {
    if (!t || (!ids && n) || !text)
        return xent_set_error(XENT_ERR_NULL, "detokenize: NULL argument");
    size_t cap = 1;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n)
            return xent_set_error(XENT_ERR_LABEL, "ids[%lld] = %d is outside [0, "
                              "%lld)", (long long)i, ids[i], (long long)t->n);
        cap += strlen(t->tok[ids[i]]);
    }
    char *o = malloc(cap);
    if (!o) return xent_set_error(XENT_ERR_ALLOC, "detokenize");
    size_t k = 0;
    const int spm = t->pre >= PRE_SPM;
    for (int64_t i = 0; i < n; i++) {
        const unsigned char *s = (const unsigned char *)t->tok[ids[i]];
        int special = t->type[ids[i]] == 3 || t->type[ids[i]] == 4;
        size_t l = strlen((const char *)s);
        unsigned hx;
        if (spm && !special && l == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' &&
            sscanf((const char *)s + 3, "%2X", &hx) == 1) {
            o[k++] = (char)hx; /* a byte-fallback token: its byte */
            continue;
        }
        if (spm) { /* U+2581 -> space, the rest as is */
            for (size_t j = 0; j < l;) {
                if (!special && j + 3 <= l && !memcmp(s + j, "\xE2\x96\x81", 3)) {
                    o[k++] = ' ';
                    j += 3;
                } else {
                    o[k++] = (char)s[j++];
                }
            }
            continue;
        }
        for (size_t j = 0; j < l;) {
            uint32_t c = s[j];
            size_t w = 1;
            if ((c >> 5) == 6 && j + 1 < l) c = ((c & 31u) << 6) | (s[j + 1] & 63u), w = 2;
            if (!special && c < 324 && t->unsym[c] >= 0) {
                o[k++] = (char)t->unsym[c];
                j += w;
            } else {
                o[k++] = (char)s[j++]; /* copy the raw byte */
            }
        }
    }
    o[k] = 0;
    if (t->pre == PRE_SPM_PREPEND && k > 0 && o[0] == ' ') /* the prepended mark */
        memmove(o, o + 1, k--);
    *text = o;
    if (len) *len = k;
    return XENT_OK;
}
