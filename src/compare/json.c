/* src/compare/json.c: a strict JSON reader for `xent compare` inputs.
 *
 * Accepts RFC 8259 JSON plus the bare tokens NaN, Infinity and -Infinity
 * that Python's json module writes. The input is a sequence of top-level
 * values separated by white space (JSON Lines is the usual case):
 *   {"tokens": [..], "logprobs": [..], "prompt_len": k, "entropy": [..],
 *    "mask": [0, 1, ..], ...}         one sequence (entropy: per token, nats;
 *                                     mask: 1 = the token enters the
 *                                     statistics; the log-prob and mask
 *                                     keys may be renamed: xent__cmp_keys)
 *   {"tokens": [[..], [..]], ...}     token ids of several sequences (audit)
 *   [[..], [..]] or [..]              token ids only
 * Every byte is bounds-checked against the buffer's end (the buffer is also
 * NUL-terminated); nesting is limited to XENT__CMP_JSON_DEPTH; strings must
 * be valid UTF-8 without raw control characters; numbers follow the JSON
 * grammar (no hex, no leading zeros, no '+'); duplicate known keys are
 * refused. Messages give FILE:LINE:COLUMN. */
#include "compare/compare.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define XENT__CMP_JSON_DEPTH 64
#define XENT__CMP_NUM_MAX 400 /* longest number literal accepted (chars)   */

typedef struct {
    const char *p, *end;    /* cursor and end of the buffer                 */
    const char *line_start;
    int64_t line;
    const char *name;
} jcur;

static xent_status jfail(const jcur *c, const char *what) {
    return xent_set_error(XENT_ERR_FORMAT, "%s:%lld:%lld: %s", c->name,
                      (long long)c->line, (long long)(c->p - c->line_start + 1), what);
}

static void ws(jcur *c) {
    while (c->p < c->end) {
        char ch = *c->p;
        if (ch == '\n') {
            c->line++;
            c->line_start = c->p + 1;
        } else if (ch != ' ' && ch != '\t' && ch != '\r') {
            return;
        }
        c->p++;
    }
}

static int peek(const jcur *c) { return c->p < c->end ? (unsigned char)*c->p : -1; }

static int lit(jcur *c, const char *w) {
    size_t k = strlen(w);
    if ((size_t)(c->end - c->p) < k || memcmp(c->p, w, k)) return 0;
    c->p += k;
    return 1;
}

/* ---- strings ------------------------------------------------------------- */

static int hex4(const char *p, unsigned *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char h = p[i];
        int d = h >= '0' && h <= '9' ? h - '0'
              : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) return 0;
        *v = *v * 16 + (unsigned)d;
    }
    return 1;
}

/* Length of the valid UTF-8 sequence at p (< end), 0 if invalid. */
static int utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    int n;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; min = 0x10000; }
    else return 0;
    if (end - p < n) return 0;
    unsigned cp = c & (0x7Fu >> n);
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

/* Parses a string; copies up to cap-1 bytes of its ASCII content into out
 * (escapes decoded when they are ASCII, others as '?'); *trunc set when the
 * string did not fit. */
static xent_status jstring(jcur *c, char *out, size_t cap, int *trunc) {
    size_t k = 0;
    *trunc = 0;
    if (peek(c) != '"') return jfail(c, "expected a string");
    c->p++;
    for (;;) {
        if (c->p >= c->end) return jfail(c, "unterminated string");
        unsigned char ch = (unsigned char)*c->p;
        char put;
        if (ch == '"') { c->p++; break; }
        if (ch < 0x20) return jfail(c, "control character inside a string");
        if (ch == '\\') {
            if (c->end - c->p < 2) return jfail(c, "unterminated escape");
            char e = c->p[1];
            const char *map = strchr("\"\\/bfnrt", e);
            if (e && map) {
                put = "\"\\/\b\f\n\r\t"[map - "\"\\/bfnrt"];
                c->p += 2;
            } else if (e == 'u') {
                unsigned v;
                if (c->end - c->p < 6 || !hex4(c->p + 2, &v))
                    return jfail(c, "bad \\u escape");
                c->p += 6;
                if (v >= 0xD800 && v <= 0xDBFF) { /* needs a low surrogate */
                    unsigned lo;
                    if (c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u' ||
                        !hex4(c->p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                        return jfail(c, "unpaired surrogate in \\u escape");
                    c->p += 6;
                } else if (v >= 0xDC00 && v <= 0xDFFF) {
                    return jfail(c, "unpaired surrogate in \\u escape");
                }
                put = v < 0x80 ? (char)v : '?';
            } else {
                return jfail(c, "bad escape in string");
            }
        } else {
            int n = utf8_len((const unsigned char *)c->p, (const unsigned char *)c->end);
            if (!n) return jfail(c, "invalid UTF-8 in string");
            put = n == 1 ? (char)ch : '?';
            c->p += n;
        }
        if (k + 1 < cap) out[k++] = put;
        else *trunc = 1;
    }
    if (cap) out[k] = 0;
    return XENT_OK;
}

/* ---- numbers ------------------------------------------------------------- */

/* Parses a number (or NaN / Infinity / -Infinity). *is_int: an integer
 * literal that fits int64 (value in *iv). */
static xent_status jnumber(jcur *c, double *v, int *is_int, int64_t *iv) {
    const char *s = c->p;
    *is_int = 0;
    if (lit(c, "NaN")) { *v = NAN; return XENT_OK; }
    if (lit(c, "Infinity")) { *v = INFINITY; return XENT_OK; }
    if (lit(c, "-Infinity")) { *v = -INFINITY; return XENT_OK; }
    const char *p = s, *e = c->end;
    int integral = 1;
    if (p < e && *p == '-') p++;
    if (p < e && *p == '0') p++;
    else if (p < e && *p >= '1' && *p <= '9') while (p < e && *p >= '0' && *p <= '9') p++;
    else return jfail(c, "expected a number");
    if (p < e && *p == '.') {
        integral = 0;
        p++;
        if (!(p < e && *p >= '0' && *p <= '9')) { c->p = p; return jfail(c, "expected a digit after '.'"); }
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        integral = 0;
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (!(p < e && *p >= '0' && *p <= '9')) { c->p = p; return jfail(c, "expected a digit in the exponent"); }
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p - s > XENT__CMP_NUM_MAX) return jfail(c, "number literal too long");
    char tmp[XENT__CMP_NUM_MAX + 1];
    memcpy(tmp, s, (size_t)(p - s));
    tmp[p - s] = 0;
    *v = strtod(tmp, NULL);
    if (integral) {
        errno = 0;
        long long x = strtoll(tmp, NULL, 10);
        if (!errno) { *is_int = 1; *iv = x; }
    }
    c->p = p;
    return XENT_OK;
}

/* ---- generic values ------------------------------------------------------ */

static xent_status jskip(jcur *c, int depth);

static xent_status jskip_container(jcur *c, int depth, char close, int obj) {
    if (depth >= XENT__CMP_JSON_DEPTH) return jfail(c, "nesting too deep");
    c->p++;
    ws(c);
    if (peek(c) == close) { c->p++; return XENT_OK; }
    for (;;) {
        xent_status s;
        if (obj) {
            char key[8];
            int tr;
            if ((s = jstring(c, key, sizeof key, &tr))) return s;
            ws(c);
            if (peek(c) != ':') return jfail(c, "expected ':'");
            c->p++;
            ws(c);
        }
        if ((s = jskip(c, depth + 1))) return s;
        ws(c);
        int ch = peek(c);
        if (ch == ',') { c->p++; ws(c); continue; }
        if (ch == close) { c->p++; return XENT_OK; }
        return jfail(c, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static xent_status jskip(jcur *c, int depth) {
    int ch = peek(c);
    char tmp[1];
    int tr;
    double v;
    int64_t iv;
    int ii;
    if (ch == '{') return jskip_container(c, depth, '}', 1);
    if (ch == '[') return jskip_container(c, depth, ']', 0);
    if (ch == '"') return jstring(c, tmp, sizeof tmp, &tr);
    if (lit(c, "true") || lit(c, "false") || lit(c, "null")) return XENT_OK;
    return jnumber(c, &v, &ii, &iv);
}

/* ---- growable arrays ----------------------------------------------------- */

typedef struct { void *p; int64_t n, cap; } vec;

static xent_status vpush(vec *v, const void *x, size_t sz, const char *name) {
    if (v->n == v->cap) {
        int64_t cap = v->cap ? v->cap * 2 : 256;
        void *q = realloc(v->p, (size_t)cap * sz);
        if (!q) return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", name);
        v->p = q;
        v->cap = cap;
    }
    memcpy((char *)v->p + (size_t)v->n * sz, x, sz);
    v->n++;
    return XENT_OK;
}

/* " (--key-a)" after a message about a key a flag named, else "". */
static void flag_note(char *buf, size_t cap, const char *flag) {
    if (flag) snprintf(buf, cap, " (%s)", flag);
    else if (cap) buf[0] = 0;
}

/* An array of log-probs (or entropies, key = "entropy"): numbers, or null
 * (read as NaN: a missing value). flag: the flag that named the key, or
 * NULL. */
static xent_status jnumbers(jcur *c, vec *lp, const char *key, const char *flag) {
    char msg[400], note[64];
    flag_note(note, sizeof note, flag);
    snprintf(msg, sizeof msg, "\"%.256s\"%s must be an array of numbers", key, note);
    if (peek(c) != '[') return jfail(c, msg);
    c->p++;
    ws(c);
    if (peek(c) == ']') { c->p++; return XENT_OK; }
    for (;;) {
        double v;
        int ii;
        int64_t iv;
        xent_status s;
        if (lit(c, "null")) v = NAN;
        else if ((s = jnumber(c, &v, &ii, &iv))) return s;
        if ((s = vpush(lp, &v, sizeof v, c->name))) return s;
        ws(c);
        int ch = peek(c);
        if (ch == ',') { c->p++; ws(c); continue; }
        if (ch == ']') { c->p++; return XENT_OK; }
        snprintf(msg, sizeof msg, "expected ',' or ']' in \"%.256s\"%s", key, note);
        return jfail(c, msg);
    }
}

/* A per-token mask: an array of 0, 1, false, true. */
static xent_status jmask(jcur *c, vec *m, const char *key, const char *flag) {
    char msg[400], note[64];
    flag_note(note, sizeof note, flag);
    snprintf(msg, sizeof msg, "\"%.256s\"%s must be an array of 0 and 1", key, note);
    if (peek(c) != '[') return jfail(c, msg);
    c->p++;
    ws(c);
    if (peek(c) == ']') { c->p++; return XENT_OK; }
    for (int64_t k = 0;; k++) {
        uint8_t v;
        if (lit(c, "true")) v = 1;
        else if (lit(c, "false")) v = 0;
        else {
            double d;
            int ii;
            int64_t iv;
            const char *at = c->p;
            xent_status s = peek(c) == '-' || (peek(c) >= '0' && peek(c) <= '9')
                                ? jnumber(c, &d, &ii, &iv) : jfail(c, msg);
            if (s) return s;
            if (!ii || (iv != 0 && iv != 1)) {
                c->p = at;
                size_t w = strcspn(at, ",]} \t\r\n");
                snprintf(msg, sizeof msg, "\"%.256s\"[%lld] = %.*s is not 0 or 1%s", key,
                         (long long)k, (int)(w > 40 ? 40 : w), at, note);
                return jfail(c, msg);
            }
            v = (uint8_t)iv;
        }
        xent_status s = vpush(m, &v, sizeof v, c->name);
        if (s) return s;
        ws(c);
        int ch = peek(c);
        if (ch == ',') { c->p++; ws(c); continue; }
        if (ch == ']') { c->p++; return XENT_OK; }
        snprintf(msg, sizeof msg, "expected ',' or ']' in \"%.256s\"%s", key, note);
        return jfail(c, msg);
    }
}

/* An array of token ids (integers >= 0). */
static xent_status jids(jcur *c, vec *tok) {
    if (peek(c) != '[') return jfail(c, "token ids must be an array of integers");
    c->p++;
    ws(c);
    if (peek(c) == ']') { c->p++; return XENT_OK; }
    for (;;) {
        double v;
        int ii;
        int64_t iv;
        xent_status s = jnumber(c, &v, &ii, &iv);
        if (s) return s;
        if (!ii || iv < 0) return jfail(c, "a token id must be an integer >= 0");
        if ((s = vpush(tok, &iv, sizeof iv, c->name))) return s;
        ws(c);
        int ch = peek(c);
        if (ch == ',') { c->p++; ws(c); continue; }
        if (ch == ']') { c->p++; return XENT_OK; }
        return jfail(c, "expected ',' or ']' in token ids");
    }
}

/* Token ids: [ints] (one sequence) or [[ints], ...] (several). Pushes the
 * end offset of each sequence. */
static xent_status jids_nested(jcur *c, vec *tok, vec *off) {
    const char *save = c->p, *save_ls = c->line_start;
    int64_t save_line = c->line;
    if (peek(c) != '[') return jfail(c, "token ids must be an array");
    c->p++;
    ws(c);
    if (peek(c) != '[') { /* flat */
        c->p = save;
        c->line = save_line;
        c->line_start = save_ls;
        xent_status s = jids(c, tok);
        return s ? s : vpush(off, &tok->n, sizeof tok->n, c->name);
    }
    for (;;) {
        xent_status s = jids(c, tok);
        if (s) return s;
        if ((s = vpush(off, &tok->n, sizeof tok->n, c->name))) return s;
        ws(c);
        int ch = peek(c);
        if (ch == ',') { c->p++; ws(c); continue; }
        if (ch == ']') { c->p++; return XENT_OK; }
        return jfail(c, "expected ',' or ']' between token-id arrays");
    }
}

/* ---- objects ------------------------------------------------------------- */

typedef struct {
    vec lp, tok, off, plen;  /* double, int64, int64 (ends), int64         */
    vec ent;                 /* double                                      */
    vec mask;                /* uint8                                       */
    int64_t nobj, nobj_tok, nobj_plen, nobj_ent, nobj_mask;
    const char *lp_key, *lp_flag, *mask_key, *mask_flag;
} jstate;

/* Appends the key (quoted, comma-separated) to a short list of the keys an
 * object has, for the message about a missing key. */
static void note_key(char *list, size_t cap, const char *key, int trunc) {
    size_t n = strlen(list);
    if (n + 8 >= cap) return;
    int w = snprintf(list + n, cap - n, "%s\"%.40s%s\"", n ? ", " : "", key,
                     trunc || strlen(key) > 40 ? "..." : "");
    if (w < 0 || (size_t)w >= cap - n) snprintf(list + (cap > 5 ? cap - 5 : 0), 5, ", ..");
}

static xent_status jobject(jcur *c, int need_lp, jstate *st) {
    int seen_lp = 0, seen_tok = 0, seen_pl = 0, seen_ent = 0, seen_mask = 0;
    int64_t lp0 = st->lp.n, tok0 = st->tok.n, off0 = st->off.n, ent0 = st->ent.n, plen = 0;
    int64_t mask0 = st->mask.n;
    int64_t line = c->line;
    char keys[200] = "", dup[400], fl[64];
    c->p++;
    ws(c);
    if (peek(c) != '}') for (;;) {
        char key[XENT__CMP_KEY_MAX + 1];
        int tr;
        xent_status s = jstring(c, key, sizeof key, &tr);
        if (s) return s;
        note_key(keys, sizeof keys, key, tr);
        ws(c);
        if (peek(c) != ':') return jfail(c, "expected ':'");
        c->p++;
        ws(c);
        if (!tr && need_lp && !strcmp(key, st->lp_key)) {
            flag_note(fl, sizeof fl, st->lp_flag);
            snprintf(dup, sizeof dup, "duplicate key \"%s\"%s", key, fl);
            if (seen_lp++) return jfail(c, dup);
            s = jnumbers(c, &st->lp, key, st->lp_flag);
        } else if (!tr && need_lp && !strcmp(key, st->mask_key)) {
            flag_note(fl, sizeof fl, st->mask_flag);
            snprintf(dup, sizeof dup, "duplicate key \"%s\"%s", key, fl);
            if (seen_mask++) return jfail(c, dup);
            s = jmask(c, &st->mask, key, st->mask_flag);
        } else if (!tr && !strcmp(key, "entropy") && need_lp) {
            if (seen_ent++) return jfail(c, "duplicate key \"entropy\"");
            s = jnumbers(c, &st->ent, "entropy", NULL);
        } else if (!tr && !strcmp(key, "tokens")) {
            if (seen_tok++) return jfail(c, "duplicate key \"tokens\"");
            s = need_lp ? jids(c, &st->tok) : jids_nested(c, &st->tok, &st->off);
        } else if (!tr && !strcmp(key, "prompt_len") && need_lp) {
            if (seen_pl++) return jfail(c, "duplicate key \"prompt_len\"");
            double v;
            int ii;
            s = jnumber(c, &v, &ii, &plen);
            if (!s && (!ii || plen < 0)) s = jfail(c, "\"prompt_len\" must be an integer >= 0");
        } else {
            s = jskip(c, 1);
        }
        if (s) return s;
        ws(c);
        int ch = peek(c);
        if (ch == ',') { c->p++; ws(c); continue; }
        if (ch == '}') break;
        return jfail(c, "expected ',' or '}'");
    }
    c->p++;
    st->nobj++;
    if (!need_lp) {
        if (!seen_tok)
            return xent_set_error(XENT_ERR_FORMAT, "%s:%lld: object has no \"tokens\"",
                              c->name, (long long)line);
        (void)off0;
        return XENT_OK;
    }
    if (!seen_lp) {
        if (st->lp_flag)
            return xent_set_error(XENT_ERR_FORMAT, "%s:%lld: %s %s: the object has no \"%s\" "
                              "(its keys: %s)", c->name, (long long)line, st->lp_flag,
                              st->lp_key, st->lp_key, keys[0] ? keys : "none");
        return xent_set_error(XENT_ERR_FORMAT, "%s:%lld: object has no \"%s\" (its keys: %s)",
                          c->name, (long long)line, st->lp_key, keys[0] ? keys : "none");
    }
    int64_t len = st->lp.n - lp0;
    if (seen_tok && st->tok.n - tok0 != len)
        return xent_set_error(XENT_ERR_SHAPE,
                          "%s:%lld: \"tokens\" has %lld entries but \"%s\" has %lld",
                          c->name, (long long)line, (long long)(st->tok.n - tok0), st->lp_key,
                          (long long)len);
    if (seen_ent && st->ent.n - ent0 != len)
        return xent_set_error(XENT_ERR_SHAPE,
                          "%s:%lld: \"entropy\" has %lld entries but \"%s\" has %lld",
                          c->name, (long long)line, (long long)(st->ent.n - ent0), st->lp_key,
                          (long long)len);
    flag_note(fl, sizeof fl, st->mask_flag);
    if (seen_mask && st->mask.n - mask0 != len)
        return xent_set_error(XENT_ERR_SHAPE,
                          "%s:%lld: \"%s\"%s has %lld entries but \"%s\" has %lld",
                          c->name, (long long)line, st->mask_key, fl,
                          (long long)(st->mask.n - mask0), st->lp_key, (long long)len);
    if ((st->nobj_ent > 0) != seen_ent && st->nobj > 1)
        return xent_set_error(XENT_ERR_FORMAT, "%s:%lld: \"entropy\" must be on every line or on none",
                          c->name, (long long)line);
    if ((st->nobj_mask > 0) != seen_mask && st->nobj > 1)
        return xent_set_error(XENT_ERR_FORMAT, "%s:%lld: \"%s\"%s must be on every line or on none",
                          c->name, (long long)line, st->mask_key, fl);
    st->nobj_ent += seen_ent;
    st->nobj_mask += seen_mask;
    if (seen_pl && plen > len)
        return xent_set_error(XENT_ERR_VALUE, "%s:%lld: \"prompt_len\" = %lld is above the length %lld",
                          c->name, (long long)line, (long long)plen, (long long)len);
    if ((st->nobj_tok > 0) != seen_tok && st->nobj > 1)
        return xent_set_error(XENT_ERR_FORMAT, "%s:%lld: \"tokens\" must be on every line or on none",
                          c->name, (long long)line);
    if ((st->nobj_plen > 0) != seen_pl && st->nobj > 1)
        return xent_set_error(XENT_ERR_FORMAT, "%s:%lld: \"prompt_len\" must be on every line or on none",
                          c->name, (long long)line);
    st->nobj_tok += seen_tok;
    st->nobj_plen += seen_pl;
    xent_status s = vpush(&st->off, &st->lp.n, sizeof(int64_t), c->name);
    return s ? s : vpush(&st->plen, &plen, sizeof plen, c->name);
}

static void jstate_free(jstate *st) {
    free(st->lp.p);
    free(st->tok.p);
    free(st->off.p);
    free(st->plen.p);
    free(st->ent.p);
    free(st->mask.p);
}

/* Moves the parsed arrays into the series. */
static xent_status jfinish(const char *name, int need_lp, jstate *st,
                           xent__cmp_series *out) {
    int64_t nseq = st->off.n;
    int64_t *off = malloc((size_t)(nseq + 1) * sizeof *off); /* [nseq + 1] */
    if (!off) return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", name);
    off[0] = 0;
    memcpy(off + 1, st->off.p, (size_t)nseq * sizeof *off);
    out->offsets = off;
    out->nseq = nseq;
    if (need_lp) {
        out->lp = st->lp.p;
        out->n = st->lp.n;
        st->lp.p = NULL;
        if (st->nobj_tok) {
            out->tokens = st->tok.p;
            out->ntok = st->tok.n;
            st->tok.p = NULL;
        }
        if (st->nobj_ent) {
            out->ent = st->ent.p;
            out->nent = st->ent.n;
            st->ent.p = NULL;
        }
        if (st->nobj_mask) {
            out->lmask = st->mask.p;
            out->nlmask = st->mask.n;
            st->mask.p = NULL;
        }
        if (st->nobj_plen) {
            uint8_t *m = malloc((size_t)(out->n ? out->n : 1)); /* [n] */
            if (!m) return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", name);
            const int64_t *pl = st->plen.p;
            for (int64_t q = 0; q < nseq; q++)
                for (int64_t i = off[q]; i < off[q + 1]; i++)
                    m[i] = i - off[q] >= pl[q];
            out->mask = m;
            out->nmask = out->n;
        }
    } else {
        out->tokens = st->tok.p;
        out->ntok = st->tok.n;
        st->tok.p = NULL;
    }
    return XENT_OK;
}

xent_status xent__cmp_parse_json(const char *name, const char *buf, size_t len,
                                 int need_lp, xent__cmp_series *out) {
    return xent__cmp_parse_json_keys(name, buf, len, need_lp, NULL, out);
}

xent_status xent__cmp_parse_json_keys(const char *name, const char *buf, size_t len,
                                      int need_lp, const xent__cmp_keys *keys,
                                      xent__cmp_series *out) {
    jcur c = {buf, buf + len, buf, 1, name};
    jstate st;
    memset(&st, 0, sizeof st);
    st.lp_key = keys && keys->lp ? keys->lp : "logprobs";
    st.lp_flag = keys && keys->lp ? keys->lp_flag : NULL;
    st.mask_key = keys && keys->mask ? keys->mask : "mask";
    st.mask_flag = keys && keys->mask ? keys->mask_flag : NULL;
    memset(out, 0, sizeof *out);
    xent_status s = XENT_OK;
    ws(&c);
    while (!s && c.p < c.end) {
        int ch = peek(&c);
        if (ch == '{') s = jobject(&c, need_lp, &st);
        else if (ch == '[' && !need_lp) s = jids_nested(&c, &st.tok, &st.off);
        else if (need_lp) {
            char msg[400];
            snprintf(msg, sizeof msg, "expected an object {\"%s\": [...], ...}", st.lp_key);
            s = jfail(&c, msg);
        } else s = jfail(&c, "expected an object or an array of token ids");
        if (!s) {
            int64_t line = c.line;
            ws(&c);
            if (c.p < c.end && c.line == line)
                s = jfail(&c, "expected a newline after the value");
        }
    }
    if (!s && (need_lp ? st.nobj == 0 : st.off.n == 0))
        s = xent_set_error(XENT_ERR_SHAPE, "%s: no sequences", name);
    if (!s && need_lp && st.lp.n == 0)
        s = xent_set_error(XENT_ERR_SHAPE, "%s: no log-probs (every \"%s\" is empty)", name,
                           st.lp_key);
    if (!s && !need_lp && st.tok.n == 0)
        s = xent_set_error(XENT_ERR_SHAPE, "%s: no token ids", name);
    if (!s) s = jfinish(name, need_lp, &st, out);
    jstate_free(&st);
    if (s) xent__cmp_series_free(out);
    return s;
}
