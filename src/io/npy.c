/* src/io/npy.c: .npy reader (versions 1.0, 2.0, 3.0) and writer (1.0).
 *
 * Layout: "\x93NUMPY", major, minor, header length (u16 LE for 1.0, u32 LE
 * for 2.0/3.0), then a Python dict literal
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * padded with spaces and a final '\n', then the C-order data. The dict is
 * parsed by a small grammar of its own (strings, True/False, tuples of
 * integers): nothing is evaluated. */
#include "io_internal.h"

#include <errno.h>
#include <stdlib.h>

#define NPY_MAX_HEADER ((uint64_t)1 << 20)

typedef struct npy_hdr {
    char descr[16];
    int have_descr, have_fortran, have_shape;
    int fortran;
    int ndim;
    int64_t shape[XENT_MAX_DIMS];
} npy_hdr;

typedef struct lex {
    const char *p;
    size_t n, i;
    const xent__src *s;
} lex;

static xent_status lerr(const lex *L, const char *msg) {
    return xent_set_error(XENT_ERR_FORMAT, "%s: bad .npy header at character %zu: %s", L->s->path, L->i, msg);
}

static void ws(lex *L) {
    while (L->i < L->n && (L->p[L->i] == ' ' || L->p[L->i] == '\t' || L->p[L->i] == '\n' ||
                           L->p[L->i] == '\r'))
        L->i++;
}

static int peek(lex *L) { ws(L); return L->i < L->n ? (unsigned char)L->p[L->i] : -1; }

static int eat(lex *L, char c) {
    if (peek(L) == c) { L->i++; return 1; }
    return 0;
}

/* A quoted string (no escapes needed for the keys and dtypes numpy writes;
 * a backslash is refused). Copies at most cap-1 bytes; longer is an error. */
static xent_status lex_str(lex *L, char *out, size_t cap) {
    int q = peek(L);
    if (q != '\'' && q != '"') return lerr(L, "expected a quoted string");
    size_t start = ++L->i;
    while (L->i < L->n && L->p[L->i] != q) {
        if (L->p[L->i] == '\\') return lerr(L, "escapes are not supported");
        L->i++;
    }
    if (L->i >= L->n) return lerr(L, "unterminated string");
    size_t len = L->i - start;
    L->i++;
    if (len >= cap) return lerr(L, "string too long");
    memcpy(out, L->p + start, len);
    out[len] = '\0';
    return XENT_OK;
}

static int lex_word(lex *L, const char *w) {
    size_t k = strlen(w);
    ws(L);
    if (L->n - L->i >= k && !memcmp(L->p + L->i, w, k)) { L->i += k; return 1; }
    return 0;
}

/* (d0, d1, ...) with an optional trailing comma; "L" suffixes allowed. */
static xent_status lex_shape(lex *L, npy_hdr *h) {
    if (!eat(L, '(')) return lerr(L, "'shape' must be a tuple");
    h->ndim = 0;
    for (;;) {
        if (eat(L, ')')) return XENT_OK;
        int c = peek(L);
        if (c < '0' || c > '9') return lerr(L, "shape entries must be non-negative integers");
        int64_t v = 0;
        while (L->i < L->n && L->p[L->i] >= '0' && L->p[L->i] <= '9') {
            int dgt = L->p[L->i++] - '0';
            if (v > (XENT__MAX_DIM - dgt) / 10) return lerr(L, "a dimension is too large");
            v = v * 10 + dgt;
        }
        if (L->i < L->n && L->p[L->i] == 'L') L->i++;
        if (h->ndim >= XENT_MAX_DIMS) return lerr(L, "too many dimensions");
        h->shape[h->ndim++] = v;
        if (eat(L, ',')) continue;
        if (eat(L, ')')) return XENT_OK;
        return lerr(L, "expected ',' or ')' in the shape");
    }
}

static xent_status parse_header(lex *L, npy_hdr *h) {
    memset(h, 0, sizeof *h);
    if (!eat(L, '{')) return lerr(L, "expected '{'");
    for (;;) {
        if (eat(L, '}')) break;
        char key[32];
        xent_status st = lex_str(L, key, sizeof key);
        if (st) return st;
        if (!eat(L, ':')) return lerr(L, "expected ':'");
        if (!strcmp(key, "descr")) {
            if (h->have_descr++) return lerr(L, "duplicate 'descr'");
            if (peek(L) == '[')
                return xent_set_error(XENT_ERR_DTYPE, "%s: structured .npy arrays are not supported", L->s->path);
            if ((st = lex_str(L, h->descr, sizeof h->descr))) return st;
        } else if (!strcmp(key, "fortran_order")) {
            if (h->have_fortran++) return lerr(L, "duplicate 'fortran_order'");
            if (lex_word(L, "True")) h->fortran = 1;
            else if (lex_word(L, "False")) h->fortran = 0;
            else return lerr(L, "'fortran_order' must be True or False");
        } else if (!strcmp(key, "shape")) {
            if (h->have_shape++) return lerr(L, "duplicate 'shape'");
            if ((st = lex_shape(L, h))) return st;
        } else {
            return lerr(L, "unknown key (expected 'descr', 'fortran_order', 'shape')");
        }
        if (eat(L, ',')) continue;
        if (eat(L, '}')) break;
        return lerr(L, "expected ',' or '}'");
    }
    ws(L);
    if (L->i != L->n) return lerr(L, "trailing characters after the dict");
    if (!h->have_descr) return lerr(L, "missing 'descr'");
    if (!h->have_fortran) return lerr(L, "missing 'fortran_order'");
    if (!h->have_shape) return lerr(L, "missing 'shape'");
    return XENT_OK;
}

/* Maps a descr to a dtype; big-endian and unknown ones are refused. */
static xent_status map_descr(const xent__src *s, const char *d, xent_dtype *out) {
    static const struct { const char *code; xent_dtype t; } tab[] = {
        {"f4", XENT_F32}, {"f2", XENT_F16}, {"f8", XENT_F64},
        {"i4", XENT_I32}, {"i8", XENT_I64}, {"u1", XENT_U8},
    };
    char order = d[0];
    if (order == '>')
        return xent_set_error(XENT_ERR_DTYPE, "%s: big-endian dtype '%s' is not supported "
                          "(save little-endian: arr.astype(arr.dtype.newbyteorder('<')))", s->path, d);
    if (order == '<' || order == '|' || order == '=') {
        for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
            if (!strcmp(d + 1, tab[i].code) && (order != '|' || tab[i].t == XENT_U8)) {
                *out = tab[i].t;
                return XENT_OK;
            }
    }
    /* numpy has no bfloat16: ml_dtypes.bfloat16 arrays are saved with the
     * little-endian 2-byte void descr '<V2' */
    if (!strcmp(d, "<V2")) {
        *out = XENT_BF16;
        return XENT_OK;
    }
    if (!strcmp(d + 1, "V2"))
        return xent_set_error(XENT_ERR_DTYPE, "%s: .npy dtype '%s' is a raw 2-byte type; a bfloat16 "
                              "array (ml_dtypes.bfloat16) is saved as '<V2': save "
                              "arr.astype(ml_dtypes.bfloat16) or arr.astype(np.float32)", s->path, d);
    return xent_set_error(XENT_ERR_DTYPE, "%s: unsupported .npy dtype '%s' (supported: <f4 <f2 <f8 <i4 <i8 |u1, "
                      "and <V2 as bfloat16)", s->path, d);
}

xent_status xent__npy_load(const xent__src *s, xent_tensor *out) {
    unsigned char pre[12];
    if (s->size < 10)
        return xent_set_error(XENT_ERR_FORMAT, "%s: truncated: %llu bytes is too short for a .npy file",
                          s->path, (unsigned long long)s->size);
    xent_status st = xent__src_read(s, 0, pre, 10);
    if (st) return st;
    if (memcmp(pre, "\x93NUMPY", 6) != 0)
        return xent_set_error(XENT_ERR_FORMAT, "%s: bad .npy magic (expected \\x93NUMPY)", s->path);
    int major = pre[6], minor = pre[7];
    if (major < 1 || major > 3 || minor != 0)
        return xent_set_error(XENT_ERR_FORMAT, "%s: unsupported .npy version %d.%d (1.0, 2.0, 3.0 are read)",
                          s->path, major, minor);
    uint64_t hlen, pre_len = major == 1 ? 10 : 12;
    if (major == 1) hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
    else {
        if ((st = xent__src_read(s, 0, pre, 12))) return st;
        hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 | (uint64_t)pre[11] << 24;
    }
    if (hlen > s->size - pre_len)
        return xent_set_error(XENT_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%llu bytes)",
                          s->path, (unsigned long long)hlen, (unsigned long long)s->size);
    if (hlen > NPY_MAX_HEADER)
        return xent_set_error(XENT_ERR_FORMAT, "%s: header length %llu exceeds the limit of %llu bytes",
                          s->path, (unsigned long long)hlen, (unsigned long long)NPY_MAX_HEADER);
    char *text = malloc((size_t)hlen + 1);
    if (!text) return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", s->path);
    npy_hdr h;
    st = xent__src_read(s, pre_len, text, hlen);
    if (!st) {
        lex L = {text, (size_t)hlen, 0, s};
        st = parse_header(&L, &h);
    }
    free(text);
    if (st) return st;
    if (h.fortran)
        return xent_set_error(XENT_ERR_FORMAT, "%s: fortran_order arrays are not supported "
                          "(save with np.ascontiguousarray)", s->path);
    xent_dtype dt = XENT_F32;
    if ((st = map_descr(s, h.descr, &dt))) return st;
    int64_t numel, nbytes;
    if ((st = xent__shape_numel(s, "", h.shape, h.ndim, &numel))) return st;
    if (!xent__mul_i64(numel, (int64_t)xent_dtype_size(dt), &nbytes))
        return xent_set_error(XENT_ERR_FORMAT, "%s: the shape's byte size overflows", s->path);
    if ((uint64_t)nbytes > s->size - pre_len - hlen)
        return xent_set_error(XENT_ERR_FORMAT, "%s: truncated: the shape needs %lld data bytes, the file has %llu",
                          s->path, (long long)nbytes, (unsigned long long)(s->size - pre_len - hlen));
    xent_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = h.ndim;
    memcpy(t.shape, h.shape, sizeof t.shape);
    t.nbytes = (size_t)nbytes;
    t.data = malloc(t.nbytes ? t.nbytes : 1);
    if (!t.data) return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory for %zu bytes", s->path, t.nbytes);
    if ((st = xent__src_read(s, pre_len + hlen, t.data, t.nbytes))) { free(t.data); return st; }
    *out = t;
    return XENT_OK;
}

/* ---- writer ------------------------------------------------------------ */

static const char *npy_descr(xent_dtype t) {
    switch (t) {
    case XENT_F32: case XENT_BF16: return "<f4"; /* bf16 is widened */
    case XENT_F16: return "<f2";
    case XENT_F64: return "<f8";
    case XENT_I32: return "<i4";
    case XENT_I64: return "<i8";
    case XENT_U8: return "|u1";
    default: return NULL;
    }
}

/* Writes bf16 data widened to f32 in chunks. */
static int write_bf16_as_f32(FILE *f, const uint16_t *src, size_t n) {
    float buf[1024];
    for (size_t i = 0; i < n;) {
        size_t k = n - i < 1024 ? n - i : 1024;
        for (size_t j = 0; j < k; j++) buf[j] = xent__bf16_f32(src[i + j]);
        if (fwrite(buf, sizeof(float), k, f) != k) return 0;
        i += k;
    }
    return 1;
}

int xent__npy_write(FILE *f, const xent_tensor *t) {
    char hdr[512];
    int len = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                       npy_descr(t->dtype));
    for (int d = 0; d < t->ndim; d++)
        len += snprintf(hdr + len, sizeof hdr - (size_t)len, "%lld%s", (long long)t->shape[d],
                        t->ndim == 1 || d + 1 < t->ndim ? ", " : "");
    if (t->ndim == 1) len -= 1; /* "(3,)" as numpy writes it */
    len += snprintf(hdr + len, sizeof hdr - (size_t)len, "), }");
    /* pad with spaces so the data starts on a 64-byte boundary; end in \n */
    int total = 10 + len + 1;
    int pad = (64 - total % 64) % 64;
    memset(hdr + len, ' ', (size_t)pad);
    len += pad;
    hdr[len++] = '\n';
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                             (unsigned char)(len & 0xFF), (unsigned char)(len >> 8)};
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, (size_t)len, f) == (size_t)len;
    if (ok && t->nbytes) {
        if (t->dtype == XENT_BF16) ok = write_bf16_as_f32(f, t->data, t->nbytes / 2);
        else ok = fwrite(t->data, 1, t->nbytes, f) == t->nbytes;
    }
    return ok;
}

xent_status xent__npy_save(const char *path, const xent_tensor *t) {
    char *tmpname = NULL;
    FILE *f = xent_file_create(path, &tmpname);
    if (!f) return XENT_ERR_IO;
    int ok = xent__npy_write(f, t);
    return xent_file_commit(f, tmpname, path, ok);
}
