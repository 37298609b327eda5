/* src/io/json.c: a small strict JSON parser (RFC 8259) for safetensors
 * headers. Nesting is limited to XENT__JSON_MAX_DEPTH, so the recursion is
 * bounded; nodes and decoded strings live in two growable arrays whose size
 * is bounded by the input length (every node consumes at least one byte and a
 * decoded string is never longer than its escaped form). */
#include "io_internal.h"

#include <stdlib.h>

typedef struct parser {
    const char *p;    /* [len] input                                       */
    size_t len, pos;
    int depth;
    const char *what; /* for messages: the file                            */
    xent_json *j;
    xent_status err;
} parser;

static xent_status perr(parser *ps, const char *msg) {
    if (ps->err == XENT_OK)
        ps->err = xent_set_error(XENT_ERR_FORMAT, "%s: bad JSON header at byte %zu: %s",
                             ps->what, ps->pos, msg);
    return ps->err;
}

static void skip_ws(parser *ps) {
    while (ps->pos < ps->len) {
        char c = ps->p[ps->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        ps->pos++;
    }
}

/* Appends a node; returns its index or -1 (out of memory). */
static int64_t new_node(parser *ps, xent_json_type t) {
    xent_json *j = ps->j;
    if (j->n >= XENT__JSON_MAX_NODES) {
        perr(ps, "more JSON values than the limit of 4194304");
        return -1;
    }
    if (j->n == j->cap) {
        int64_t cap = j->cap ? j->cap * 2 : 64;
        xent_json_node *nn = realloc(j->nodes, (size_t)cap * sizeof *nn);
        if (!nn) {
            if (ps->err == XENT_OK)
                ps->err = xent_set_error(XENT_ERR_ALLOC, "%s: out of memory parsing the header", ps->what);
            return -1;
        }
        j->nodes = nn;
        j->cap = cap;
    }
    xent_json_node *n = &j->nodes[j->n];
    memset(n, 0, sizeof *n);
    n->type = t;
    n->first = n->next = -1;
    return j->n++;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Reads 4 hex digits at pos (after "\u"). */
static int read_hex4(parser *ps, uint32_t *out) {
    if (ps->len - ps->pos < 4) return 0;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(ps->p[ps->pos + (size_t)k]);
        if (h < 0) return 0;
        v = v * 16 + (uint32_t)h;
    }
    ps->pos += 4;
    *out = v;
    return 1;
}

static size_t put_utf8(char *d, uint32_t cp) {
    if (cp < 0x80) { d[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        d[0] = (char)(0xC0 | (cp >> 6)); d[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12)); d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18)); d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of a valid UTF-8 sequence starting at s (n bytes left), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t k;
    uint32_t cp, min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) { k = 2; cp = c & 0x1F; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { k = 3; cp = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { k = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return k;
}

/* Parses a string at pos (on the opening quote) into the string buffer. */
static int parse_string(parser *ps, const char **out, size_t *out_len) {
    xent_json *j = ps->j;
    ps->pos++; /* opening quote */
    /* the decoded string is at most as long as the rest of the input */
    size_t need = j->strlen_ + (ps->len - ps->pos) + 1;
    if (need > j->strcap) {
        /* strbuf is sized once to the whole input in xent_json_parse */
        perr(ps, "internal string buffer too small");
        return 0;
    }
    char *d = j->strbuf + j->strlen_;
    size_t n = 0;
    for (;;) {
        if (ps->pos >= ps->len) { perr(ps, "unterminated string"); return 0; }
        unsigned char c = (unsigned char)ps->p[ps->pos];
        if (c == '"') { ps->pos++; break; }
        if (c < 0x20) { perr(ps, "control character in a string"); return 0; }
        if (c != '\\') {
            size_t k = utf8_len((const unsigned char *)ps->p + ps->pos, ps->len - ps->pos);
            if (!k) { perr(ps, "invalid UTF-8 in a string"); return 0; }
            memcpy(d + n, ps->p + ps->pos, k);
            n += k;
            ps->pos += k;
            continue;
        }
        ps->pos++;
        if (ps->pos >= ps->len) { perr(ps, "unterminated escape"); return 0; }
        char e = ps->p[ps->pos++];
        switch (e) {
        case '"': d[n++] = '"'; break;
        case '\\': d[n++] = '\\'; break;
        case '/': d[n++] = '/'; break;
        case 'b': d[n++] = '\b'; break;
        case 'f': d[n++] = '\f'; break;
        case 'n': d[n++] = '\n'; break;
        case 'r': d[n++] = '\r'; break;
        case 't': d[n++] = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (!read_hex4(ps, &cp)) { perr(ps, "bad \\u escape"); return 0; }
            if (cp >= 0xDC00 && cp <= 0xDFFF) { perr(ps, "lone low surrogate"); return 0; }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (ps->len - ps->pos < 2 || ps->p[ps->pos] != '\\' || ps->p[ps->pos + 1] != 'u') {
                    perr(ps, "high surrogate without a low one");
                    return 0;
                }
                ps->pos += 2;
                if (!read_hex4(ps, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    perr(ps, "bad low surrogate");
                    return 0;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            n += put_utf8(d + n, cp);
            break;
        }
        default: perr(ps, "unknown escape"); return 0;
        }
    }
    d[n] = '\0';
    *out = d;
    *out_len = n;
    j->strlen_ += n + 1;
    return 1;
}

/* Validates the JSON number grammar at pos; records its text. */
static int parse_number(parser *ps, int64_t node) {
    size_t start = ps->pos, i = ps->pos;
    const char *p = ps->p;
    if (i < ps->len && p[i] == '-') i++;
    if (i >= ps->len) { perr(ps, "bad number"); return 0; }
    if (p[i] == '0') i++;
    else if (p[i] >= '1' && p[i] <= '9') { while (i < ps->len && p[i] >= '0' && p[i] <= '9') i++; }
    else { perr(ps, "bad number"); return 0; }
    if (i < ps->len && p[i] == '.') {
        i++;
        if (i >= ps->len || p[i] < '0' || p[i] > '9') { ps->pos = i; perr(ps, "bad fraction"); return 0; }
        while (i < ps->len && p[i] >= '0' && p[i] <= '9') i++;
    }
    if (i < ps->len && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < ps->len && (p[i] == '+' || p[i] == '-')) i++;
        if (i >= ps->len || p[i] < '0' || p[i] > '9') { ps->pos = i; perr(ps, "bad exponent"); return 0; }
        while (i < ps->len && p[i] >= '0' && p[i] <= '9') i++;
    }
    ps->j->nodes[node].str = p + start;
    ps->j->nodes[node].len = i - start;
    ps->pos = i;
    return 1;
}

static int parse_literal(parser *ps, const char *word) {
    size_t n = strlen(word);
    if (ps->len - ps->pos < n || memcmp(ps->p + ps->pos, word, n) != 0) {
        perr(ps, "unexpected character");
        return 0;
    }
    ps->pos += n;
    return 1;
}

static int64_t parse_value(parser *ps);

/* Links child after prev (or as parent's first child). */
static void link_child(parser *ps, int64_t parent, int64_t *prev, int64_t child) {
    xent_json_node *nodes = ps->j->nodes;
    if (*prev < 0) nodes[parent].first = child;
    else nodes[*prev].next = child;
    *prev = child;
    nodes[parent].count++;
}

static int64_t parse_array(parser *ps, int64_t node) {
    int64_t prev = -1;
    ps->pos++; /* [ */
    skip_ws(ps);
    if (ps->pos < ps->len && ps->p[ps->pos] == ']') { ps->pos++; return node; }
    for (;;) {
        int64_t c = parse_value(ps);
        if (c < 0) return -1;
        link_child(ps, node, &prev, c);
        skip_ws(ps);
        if (ps->pos >= ps->len) { perr(ps, "unterminated array"); return -1; }
        char ch = ps->p[ps->pos++];
        if (ch == ']') return node;
        if (ch != ',') { ps->pos--; perr(ps, "expected ',' or ']'"); return -1; }
    }
}

static int64_t parse_object(parser *ps, int64_t node) {
    int64_t prev = -1;
    ps->pos++; /* { */
    skip_ws(ps);
    if (ps->pos < ps->len && ps->p[ps->pos] == '}') { ps->pos++; return node; }
    for (;;) {
        skip_ws(ps);
        if (ps->pos >= ps->len || ps->p[ps->pos] != '"') { perr(ps, "expected a member name"); return -1; }
        const char *key;
        size_t key_len;
        if (!parse_string(ps, &key, &key_len)) return -1;
        skip_ws(ps);
        if (ps->pos >= ps->len || ps->p[ps->pos] != ':') { perr(ps, "expected ':'"); return -1; }
        ps->pos++;
        int64_t c = parse_value(ps);
        if (c < 0) return -1;
        ps->j->nodes[c].key = key;
        ps->j->nodes[c].key_len = key_len;
        link_child(ps, node, &prev, c);
        skip_ws(ps);
        if (ps->pos >= ps->len) { perr(ps, "unterminated object"); return -1; }
        char ch = ps->p[ps->pos++];
        if (ch == '}') return node;
        if (ch != ',') { ps->pos--; perr(ps, "expected ',' or '}'"); return -1; }
    }
}

static int64_t parse_value(parser *ps) {
    skip_ws(ps);
    if (ps->pos >= ps->len) { perr(ps, "unexpected end"); return -1; }
    char c = ps->p[ps->pos];
    int64_t node;
    switch (c) {
    case '{':
    case '[':
        if (ps->depth >= XENT__JSON_MAX_DEPTH) { perr(ps, "nested too deeply"); return -1; }
        node = new_node(ps, c == '{' ? XENT_JSON_OBJ : XENT_JSON_ARR);
        if (node < 0) return -1;
        ps->depth++;
        node = c == '{' ? parse_object(ps, node) : parse_array(ps, node);
        ps->depth--;
        return node;
    case '"':
        node = new_node(ps, XENT_JSON_STR);
        if (node < 0) return -1;
        {
            const char *s;
            size_t n;
            if (!parse_string(ps, &s, &n)) return -1;
            ps->j->nodes[node].str = s;
            ps->j->nodes[node].len = n;
        }
        return node;
    case 't': node = new_node(ps, XENT_JSON_TRUE); return node >= 0 && parse_literal(ps, "true") ? node : -1;
    case 'f': node = new_node(ps, XENT_JSON_FALSE); return node >= 0 && parse_literal(ps, "false") ? node : -1;
    case 'n': node = new_node(ps, XENT_JSON_NULL); return node >= 0 && parse_literal(ps, "null") ? node : -1;
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            node = new_node(ps, XENT_JSON_NUM);
            return node >= 0 && parse_number(ps, node) ? node : -1;
        }
        perr(ps, "unexpected character");
        return -1;
    }
}

xent_status xent_json_parse(const char *text, size_t len, const char *what,
                             xent_json *out) {
    xent_json j;
    memset(&j, 0, sizeof j);
    j.strcap = len + 1;
    j.strbuf = malloc(j.strcap);
    if (!j.strbuf) return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory for a %zu-byte header", what, len);
    parser ps = {text, len, 0, 0, what, &j, XENT_OK};
    int64_t root = parse_value(&ps);
    if (root >= 0) {
        skip_ws(&ps);
        if (ps.pos != len) perr(&ps, "trailing characters after the value");
    }
    if (ps.err != XENT_OK) {
        xent_json_free(&j);
        return ps.err;
    }
    *out = j;
    return XENT_OK;
}

void xent_json_free(xent_json *j) {
    if (!j) return;
    free(j->nodes);
    free(j->strbuf);
    memset(j, 0, sizeof *j);
}

const xent_json_node *xent_json_get(const xent_json *j, const xent_json_node *obj,
                                  const char *key) {
    if (!obj || obj->type != XENT_JSON_OBJ) return NULL;
    size_t kl = strlen(key);
    for (int64_t c = obj->first; c >= 0; c = j->nodes[c].next) {
        const xent_json_node *n = &j->nodes[c];
        if (n->key_len == kl && memcmp(n->key, key, kl) == 0) return n;
    }
    return NULL;
}

int xent_json_uint(const xent_json_node *n, int64_t *out) {
    if (!n || n->type != XENT_JSON_NUM || n->len == 0 || n->len > 19) return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < n->len; i++) {
        char c = n->str[i];
        if (c < '0' || c > '9') return 0;
        v = v * 10 + (uint64_t)(c - '0');
    }
    if (v > (uint64_t)INT64_MAX) return 0;
    *out = (int64_t)v;
    return 1;
}
