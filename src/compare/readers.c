/* src/compare/readers.c: log-prob, token-id, offset and mask sources for
 * `xent compare`: tensor files (through xent_tensor_load), plain text (one
 * number per line) and the dispatch by file name. JSON is in json.c. */
#include "compare/compare.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Text files above this size are refused (a guard against /dev/zero-like
 * inputs; 10^8 tokens at ~20 bytes each). */
#define XENT__CMP_MAX_TEXT ((size_t)4 << 30)

void xent__cmp_series_free(xent__cmp_series *s) {
    if (!s) return;
    free(s->lp);
    free(s->tokens);
    free(s->offsets);
    free(s->mask);
    free(s->ent);
    free(s->lmask);
    memset(s, 0, sizeof *s);
}

static int ends_with(const char *s, size_t n, const char *suf) {
    size_t k = strlen(suf);
    return n >= k && !strncmp(s + n - k, suf, k);
}

/* "FILE.safetensors:NAME" keeps its tensor name; only the file part counts. */
xent__cmp_fmt xent__cmp_format(const char *spec) {
    size_t n = strlen(spec);
    const char *st = strstr(spec, ".safetensors");
    if (ends_with(spec, n, ".npy") || ends_with(spec, n, ".safetensors") ||
        (st && st[12] == ':'))
        return XENT__FMT_TENSOR;
    if (ends_with(spec, n, ".jsonl") || ends_with(spec, n, ".json") ||
        ends_with(spec, n, ".ndjson"))
        return XENT__FMT_JSON;
    return XENT__FMT_TEXT;
}

xent_status xent__cmp_slurp(const char *path, char **buf, size_t *len) {
    /* a FIFO or a device is refused before it is opened for reading */
    uint64_t size = 0;
    FILE *f = xent_file_open(path, &size);
    if (!f) return XENT_ERR_IO;
    if (size > (uint64_t)XENT__CMP_MAX_TEXT) {
        fclose(f);
        return xent_set_error(XENT_ERR_FORMAT, "%s: %llu bytes, larger than the limit of %zu bytes", path,
                              (unsigned long long)size, (size_t)XENT__CMP_MAX_TEXT);
    }
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap + 1);
    if (!p) { fclose(f); return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", path); }
    for (;;) {
        if (n == cap) {
            if (cap >= XENT__CMP_MAX_TEXT) {
                free(p); fclose(f);
                return xent_set_error(XENT_ERR_FORMAT, "%s: larger than %zu bytes",
                                  path, (size_t)XENT__CMP_MAX_TEXT);
            }
            char *q = realloc(p, cap * 2 + 1);
            if (!q) { free(p); fclose(f); return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", path); }
            p = q;
            cap *= 2;
        }
        size_t got = fread(p + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) { free(p); return xent_set_error(XENT_ERR_IO, "%s: read error", path); }
    p[n] = 0;
    *buf = p;
    *len = n;
    return XENT_OK;
}

/* ---- plain text ---------------------------------------------------------- */

/* Visits the lines of buf: [b, e) without the '\n' (and a trailing '\r').
 * A final newline does not start an empty last line. */
typedef xent_status (*line_fn)(void *ctx, const char *name, int64_t line,
                               const char *b, const char *e);

static xent_status each_line(const char *name, const char *buf, size_t len,
                             line_fn fn, void *ctx) {
    const char *p = buf, *end = buf + len;
    int64_t line = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        const char *ee = (e > p && e[-1] == '\r') ? e - 1 : e;
        xent_status s = fn(ctx, name, ++line, p, ee);
        if (s) return s;
        p = nl ? nl + 1 : end;
    }
    return XENT_OK;
}

static int is_space(char c) { return c == ' ' || c == '\t'; }

/* Trims blanks; copies the field into tmp (NUL-terminated). Returns the
 * length, or -1 when empty or too long. */
static int field(const char *b, const char *e, char *tmp, int cap) {
    while (b < e && is_space(*b)) b++;
    while (e > b && is_space(e[-1])) e--;
    if (e == b || e - b >= cap || memchr(b, 0, (size_t)(e - b))) return -1;
    memcpy(tmp, b, (size_t)(e - b));
    tmp[e - b] = 0;
    return (int)(e - b);
}

typedef struct { double *v; int64_t n, cap; int64_t *iv; } numbuf;

static xent_status push_d(numbuf *nb, const char *name, double x) {
    if (nb->n == nb->cap) {
        int64_t cap = nb->cap ? nb->cap * 2 : 1024;
        double *q = realloc(nb->v, (size_t)cap * sizeof *q);
        if (!q) return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", name);
        nb->v = q;
        nb->cap = cap;
    }
    nb->v[nb->n++] = x;
    return XENT_OK;
}

static xent_status push_i(numbuf *nb, const char *name, int64_t x) {
    if (nb->n == nb->cap) {
        int64_t cap = nb->cap ? nb->cap * 2 : 1024;
        int64_t *q = realloc(nb->iv, (size_t)cap * sizeof *q);
        if (!q) return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", name);
        nb->iv = q;
        nb->cap = cap;
    }
    nb->iv[nb->n++] = x;
    return XENT_OK;
}

/* Accepts what strtod reads in the C locale, except hexadecimal numbers and
 * "nan(...)" payloads: decimal numbers, nan, inf, infinity (any case, with a
 * sign). */
static int parse_real(const char *s, double *out) {
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    if ((p[0] == '0') && (p[1] == 'x' || p[1] == 'X')) return 0;
    if (strchr(p, '(')) return 0;
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || *end) return 0;
    *out = v;
    return 1;
}

static xent_status text_line_d(void *ctx, const char *name, int64_t line,
                               const char *b, const char *e) {
    char tmp[64];
    double x;
    if (field(b, e, tmp, sizeof tmp) < 0 || !parse_real(tmp, &x))
        return xent_set_error(XENT_ERR_FORMAT,
                          "%s:%lld: expected one number on the line, got '%.*s'",
                          name, (long long)line, (int)(e - b > 40 ? 40 : e - b), b);
    return push_d(ctx, name, x);
}

static int parse_int(const char *s, int64_t *out) {
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    if (*p < '0' || *p > '9') return 0;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return 0;
    *out = v;
    return 1;
}

static xent_status text_line_i(void *ctx, const char *name, int64_t line,
                               const char *b, const char *e) {
    char tmp[64];
    int64_t x;
    if (field(b, e, tmp, sizeof tmp) < 0 || !parse_int(tmp, &x))
        return xent_set_error(XENT_ERR_FORMAT,
                          "%s:%lld: expected one integer on the line, got '%.*s'",
                          name, (long long)line, (int)(e - b > 40 ? 40 : e - b), b);
    return push_i(ctx, name, x);
}

xent_status xent__cmp_parse_text(const char *name, const char *buf, size_t len,
                                 double **v, int64_t *n) {
    numbuf nb = {0};
    xent_status s = each_line(name, buf, len, text_line_d, &nb);
    if (!s && nb.n == 0) s = xent_set_error(XENT_ERR_SHAPE, "%s: no numbers", name);
    if (s) { free(nb.v); return s; }
    *v = nb.v;
    *n = nb.n;
    return XENT_OK;
}

xent_status xent__cmp_parse_text_ints(const char *name, const char *buf,
                                      size_t len, int64_t **v, int64_t *n) {
    numbuf nb = {0};
    xent_status s = each_line(name, buf, len, text_line_i, &nb);
    if (!s && nb.n == 0) s = xent_set_error(XENT_ERR_SHAPE, "%s: no numbers", name);
    if (s) { free(nb.iv); return s; }
    *v = nb.iv;
    *n = nb.n;
    return XENT_OK;
}

/* ---- tensors ------------------------------------------------------------- */


/* Log-probs of any float dtype, flattened. *rows: the first dimension of a
 * 2-D tensor ([S, T]: S sequences of T tokens), else 0. */
static xent_status tensor_doubles(const char *spec, double **v, int64_t *n,
                                  int64_t *rows) {
    xent_tensor t;
    memset(&t, 0, sizeof t);
    xent_status s = xent_tensor_load(spec, &t);
    if (s) return s;
    int64_t m = xent_tensor_numel(&t);
    *rows = t.ndim == 2 ? t.shape[0] : 0;
    if (t.dtype != XENT_F32 && t.dtype != XENT_BF16 && t.dtype != XENT_F16 &&
        t.dtype != XENT_F64) {
        s = xent_set_error(XENT_ERR_DTYPE, "%s: log-probs must be f32, bf16, f16 or f64, not %s",
                       spec, xent_dtype_name(t.dtype));
    } else if (m <= 0) {
        s = xent_set_error(XENT_ERR_SHAPE, "%s: no elements", spec);
    }
    double *out = s ? NULL : malloc((size_t)m * sizeof *out); /* [m] */
    if (!s && !out) s = xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", spec);
    if (!s) {
        if (t.dtype == XENT_F64) {
            memcpy(out, t.data, (size_t)m * sizeof *out);
        } else if (t.dtype == XENT_F32) {
            const float *f = t.data;
            for (int64_t i = 0; i < m; i++) out[i] = f[i];
        } else {
            for (int64_t i = 0; i < m; i++) out[i] = xent__load(t.data, t.dtype, i);
        }
        *v = out;
        *n = m;
    }
    xent_tensor_free(&t);
    return s;
}

/* Float tensors holding integers (a mask saved as float32) are accepted
 * when every value is an integer of magnitude below 2^53. */
static xent_status floats_as_ints(const char *spec, int64_t **v, int64_t *n) {
    double *d = NULL;
    int64_t rows;
    xent_status s = tensor_doubles(spec, &d, n, &rows);
    if (s) return s;
    int64_t *out = malloc((size_t)*n * sizeof *out); /* [n] */
    if (!out) s = xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", spec);
    for (int64_t i = 0; !s && i < *n; i++) {
        if (!(fabs(d[i]) < 0x1p53) || d[i] != floor(d[i]))
            s = xent_set_error(XENT_ERR_VALUE, "%s: [%lld] = %g is not an integer", spec,
                           (long long)i, d[i]);
        else
            out[i] = (int64_t)d[i];
    }
    free(d);
    if (s) { free(out); return s; }
    *v = out;
    return XENT_OK;
}

static xent_status tensor_ints(const char *spec, int64_t **v, int64_t *n) {
    xent_tensor t;
    memset(&t, 0, sizeof t);
    xent_status s = xent_tensor_load(spec, &t);
    if (s) return s;
    int64_t m = xent_tensor_numel(&t);
    if (t.dtype == XENT_F32 || t.dtype == XENT_F64 || t.dtype == XENT_F16 ||
        t.dtype == XENT_BF16) {
        xent_tensor_free(&t);
        return floats_as_ints(spec, v, n);
    }
    if (t.dtype != XENT_I32 && t.dtype != XENT_I64 && t.dtype != XENT_U8)
        s = xent_set_error(XENT_ERR_DTYPE, "%s: expected an integer tensor (i32, i64, u8), not %s",
                       spec, xent_dtype_name(t.dtype));
    else if (m <= 0)
        s = xent_set_error(XENT_ERR_SHAPE, "%s: no elements", spec);
    int64_t *out = s ? NULL : malloc((size_t)m * sizeof *out); /* [m] */
    if (!s && !out) s = xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", spec);
    if (!s) {
        for (int64_t i = 0; i < m; i++)
            out[i] = t.dtype == XENT_U8 ? ((const uint8_t *)t.data)[i]
                                        : xent__label(t.data, t.dtype, i);
        *v = out;
        *n = m;
    }
    xent_tensor_free(&t);
    return s;
}

/* ---- dispatch ------------------------------------------------------------ */

/* A 2-D [S, T] tensor: S sequences of T tokens each. */
static xent_status row_offsets(const char *spec, int64_t rows, xent__cmp_series *out) {
    int64_t T = out->n / rows;
    out->offsets = malloc((size_t)(rows + 1) * sizeof *out->offsets); /* [rows + 1] */
    if (!out->offsets) return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", spec);
    for (int64_t q = 0; q <= rows; q++) out->offsets[q] = q * T;
    out->nseq = rows;
    return XENT_OK;
}

xent_status xent__cmp_load_logprobs(const char *spec, xent__cmp_series *out) {
    return xent__cmp_load_logprobs_keys(spec, NULL, out);
}

xent_status xent__cmp_load_logprobs_keys(const char *spec, const xent__cmp_keys *keys,
                                         xent__cmp_series *out) {
    memset(out, 0, sizeof *out);
    xent__cmp_fmt f = xent__cmp_format(spec);
    if (f == XENT__FMT_TENSOR) {
        int64_t rows = 0;
        xent_status s = tensor_doubles(spec, &out->lp, &out->n, &rows);
        if (!s && rows > 0) s = row_offsets(spec, rows, out);
        if (s) xent__cmp_series_free(out);
        return s;
    }
    char *buf;
    size_t len;
    xent_status s = xent__cmp_slurp(spec, &buf, &len);
    if (s) return s;
    if (f == XENT__FMT_JSON) s = xent__cmp_parse_json_keys(spec, buf, len, 1, keys, out);
    else s = xent__cmp_parse_text(spec, buf, len, &out->lp, &out->n);
    free(buf);
    if (s) xent__cmp_series_free(out);
    return s;
}

xent_status xent__cmp_load_ids(const char *spec, xent__cmp_series *out) {
    memset(out, 0, sizeof *out);
    xent__cmp_fmt f = xent__cmp_format(spec);
    xent_status s;
    if (f == XENT__FMT_TENSOR) {
        s = tensor_ints(spec, &out->tokens, &out->ntok);
    } else {
        char *buf;
        size_t len;
        s = xent__cmp_slurp(spec, &buf, &len);
        if (s) return s;
        if (f == XENT__FMT_JSON) s = xent__cmp_parse_json(spec, buf, len, 0, out);
        else s = xent__cmp_parse_text_ints(spec, buf, len, &out->tokens, &out->ntok);
        free(buf);
    }
    for (int64_t i = 0; !s && i < out->ntok; i++)
        if (out->tokens[i] < 0)
            s = xent_set_error(XENT_ERR_VALUE, "%s: token id [%lld] = %lld is negative",
                           spec, (long long)i, (long long)out->tokens[i]);
    if (!s && !out->tokens)
        s = xent_set_error(XENT_ERR_FORMAT, "%s: holds no token ids", spec);
    if (s) xent__cmp_series_free(out);
    return s;
}

xent_status xent__cmp_load_ints(const char *spec, int64_t **v, int64_t *n) {
    xent__cmp_fmt f = xent__cmp_format(spec);
    if (f == XENT__FMT_TENSOR) return tensor_ints(spec, v, n);
    if (f == XENT__FMT_JSON)
        return xent_set_error(XENT_ERR_FORMAT, "%s: offsets and masks are read from "
                          ".npy, .safetensors or text files", spec);
    char *buf;
    size_t len;
    xent_status s = xent__cmp_slurp(spec, &buf, &len);
    if (s) return s;
    s = xent__cmp_parse_text_ints(spec, buf, len, v, n);
    free(buf);
    return s;
}
