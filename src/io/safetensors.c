/* src/io/safetensors.c: .safetensors reader and writer.
 *
 * Layout: u64 little-endian N; N bytes of JSON
 *   {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 *    ..., "__metadata__": {"key": "value", ...}}
 * then the data block; offsets are relative to the data block's start.
 * The whole header is validated before any tensor is read: N against the
 * file size, every entry's dtype/shape/offsets, end - begin == numel * size
 * (overflow-checked), offsets inside the data block and not overlapping. */
#include "io_internal.h"

#include <errno.h>
#include <stdlib.h>

typedef struct st_dtype {
    const char *name;
    int xdtype; /* xent_dtype, or -1: a known safetensors dtype xent can't load */
    int size;
} st_dtype;

static const st_dtype k_dtypes[] = {
    {"F32", XENT_F32, 4}, {"BF16", XENT_BF16, 2}, {"F16", XENT_F16, 2},
    {"F64", XENT_F64, 8}, {"I32", XENT_I32, 4}, {"I64", XENT_I64, 8},
    {"U8", XENT_U8, 1},
    {"BOOL", -1, 1}, {"I8", -1, 1}, {"I16", -1, 2}, {"U16", -1, 2},
    {"U32", -1, 4}, {"U64", -1, 8}, {"F8_E4M3", -1, 1}, {"F8_E5M2", -1, 1},
};

static const char *st_name_of(xent_dtype t) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (k_dtypes[i].xdtype == (int)t) return k_dtypes[i].name;
    return NULL;
}

/* One validated header entry. */
typedef struct st_entry {
    const char *name;   /* decoded, NUL-terminated (points into the JSON)  */
    const char *dtype;  /* the header's dtype string                        */
    int xdtype;         /* -1: not loadable                                 */
    int ndim;
    int64_t shape[XENT_MAX_DIMS];
    int64_t begin, end; /* relative to the data block                       */
} st_entry;

typedef struct st_header {
    char *text;          /* [N] the header bytes (number nodes point here) */
    xent_json json;
    st_entry *e;         /* [n]                                            */
    int n;
    uint64_t data_start; /* 8 + N                                          */
} st_header;

static void header_free(st_header *h) {
    xent_json_free(&h->json);
    free(h->text);
    free(h->e);
    memset(h, 0, sizeof *h);
}

static xent_status bad(const xent__src *s, const char *name, const char *msg) {
    return xent_set_error(XENT_ERR_FORMAT, "%s: tensor '%s': %s", s->path, name, msg);
}

/* Fills e from the JSON object of one tensor; data_size bounds the offsets. */
static xent_status parse_entry(const xent__src *s, const xent_json *j,
                               const xent_json_node *v, uint64_t data_size,
                               st_entry *e) {
    e->name = v->key;
    if (v->key_len >= XENT_MAX_NAME || strlen(v->key) != v->key_len)
        return xent_set_error(XENT_ERR_FORMAT, "%s: a tensor name is longer than %d bytes or holds a NUL",
                          s->path, XENT_MAX_NAME - 1);
    if (v->type != XENT_JSON_OBJ) return bad(s, e->name, "entry is not a JSON object");
    /* each field once (the reference reader refuses a repeated field: with
     * first-wins or last-wins readers the same file would mean two things) */
    static const char *const fields[3] = {"dtype", "shape", "data_offsets"};
    int seen[3] = {0, 0, 0};
    for (int64_t c = v->first; c >= 0; c = j->nodes[c].next) {
        const xent_json_node *k = &j->nodes[c];
        for (int f = 0; f < 3; f++)
            if (k->key_len == strlen(fields[f]) && !memcmp(k->key, fields[f], k->key_len) && seen[f]++)
                return xent_set_error(XENT_ERR_FORMAT, "%s: tensor '%s': duplicate field \"%s\"", s->path,
                                  e->name, fields[f]);
    }
    const xent_json_node *dt = xent_json_get(j, v, "dtype");
    const xent_json_node *sh = xent_json_get(j, v, "shape");
    const xent_json_node *of = xent_json_get(j, v, "data_offsets");
    if (!dt || dt->type != XENT_JSON_STR) return bad(s, e->name, "missing or non-string \"dtype\"");
    if (!sh || sh->type != XENT_JSON_ARR) return bad(s, e->name, "missing or non-array \"shape\"");
    if (!of || of->type != XENT_JSON_ARR || of->count != 2)
        return bad(s, e->name, "\"data_offsets\" must be an array [begin, end]");
    if (strlen(dt->str) != dt->len)
        return bad(s, e->name, "\"dtype\" holds a NUL character");
    int size = 0;
    e->dtype = dt->str;
    e->xdtype = -1;
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (!strcmp(dt->str, k_dtypes[i].name)) { size = k_dtypes[i].size; e->xdtype = k_dtypes[i].xdtype; }
    if (!size)
        return xent_set_error(XENT_ERR_DTYPE, "%s: tensor '%s': unknown dtype '%.32s'", s->path, e->name,
                          dt->str);
    if (sh->count > XENT_MAX_DIMS)
        return xent_set_error(XENT_ERR_FORMAT, "%s: tensor '%s': %lld dimensions (at most %d)", s->path,
                          e->name, (long long)sh->count, XENT_MAX_DIMS);
    e->ndim = (int)sh->count;
    int d = 0;
    for (int64_t c = sh->first; c >= 0; c = j->nodes[c].next, d++)
        if (!xent_json_uint(&j->nodes[c], &e->shape[d]))
            return xent_set_error(XENT_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                              s->path, e->name, d);
    int64_t numel, nbytes;
    xent_status st = xent__shape_numel(s, e->name, e->shape, e->ndim, &numel);
    if (st) return st;
    if (!xent__mul_i64(numel, size, &nbytes)) return bad(s, e->name, "byte size overflows");
    const xent_json_node *b = &j->nodes[of->first], *en = &j->nodes[b->next];
    if (!xent_json_uint(b, &e->begin) || !xent_json_uint(en, &e->end))
        return bad(s, e->name, "data_offsets are not non-negative integers");
    if (e->end < e->begin)
        return xent_set_error(XENT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] are reversed",
                          s->path, e->name, (long long)e->begin, (long long)e->end);
    if ((uint64_t)e->end > data_size)
        return xent_set_error(XENT_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets end %lld is past the data block (%llu bytes)",
                          s->path, e->name, (long long)e->end, (unsigned long long)data_size);
    if (e->end - e->begin != nbytes)
        return xent_set_error(XENT_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets span %lld bytes but shape and dtype need %lld",
                          s->path, e->name, (long long)(e->end - e->begin), (long long)nbytes);
    return XENT_OK;
}

static int cmp_begin(const void *a, const void *b) {
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* No two tensors share a byte. */
static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

/* Duplicate names and overlapping data, each in O(n log n) (a hostile
 * header can hold hundreds of thousands of entries). */
static xent_status check_overlap(const xent__src *s, st_header *h) {
    if (h->n < 2) return XENT_OK;
    const st_entry **p = malloc((size_t)h->n * sizeof *p);
    if (!p) return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", s->path);
    for (int i = 0; i < h->n; i++) p[i] = &h->e[i];
    xent_status st = XENT_OK;
    qsort(p, (size_t)h->n, sizeof *p, cmp_name);
    for (int i = 1; i < h->n && !st; i++)
        if (!strcmp(p[i]->name, p[i - 1]->name))
            st = xent_set_error(XENT_ERR_FORMAT, "%s: duplicate tensor name '%s'", s->path, p[i]->name);
    qsort(p, (size_t)h->n, sizeof *p, cmp_begin);
    for (int i = 1; i < h->n && !st; i++)
        if (p[i]->begin < p[i - 1]->end)
            st = xent_set_error(XENT_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap (data_offsets %lld < %lld)",
                            s->path, p[i - 1]->name, p[i]->name, (long long)p[i]->begin,
                            (long long)p[i - 1]->end);
        else if (p[i]->begin > p[i - 1]->end)
            st = xent_set_error(XENT_ERR_FORMAT, "%s: a gap of %lld bytes between tensors '%s' and '%s' "
                            "(data_offsets %lld > %lld): the data must be contiguous",
                            s->path, (long long)(p[i]->begin - p[i - 1]->end), p[i - 1]->name,
                            p[i]->name, (long long)p[i]->begin, (long long)p[i - 1]->end);
    free(p);
    return st;
}

/* The reference reader's rule: the tensors, sorted by offset, cover the data
 * block exactly: the first starts at 0, each starts where the previous one
 * ends (no gap, no overlap: check_overlap) and the last ends at the end of
 * the file. */
static xent_status check_coverage(const xent__src *s, const st_header *h, uint64_t data_size) {
    int64_t lo = INT64_MAX, hi = 0;
    const char *first = NULL, *last = NULL;
    for (int i = 0; i < h->n; i++) {
        if (h->e[i].begin < lo) {
            lo = h->e[i].begin;
            first = h->e[i].name;
        }
        if (h->e[i].end >= hi) { hi = h->e[i].end; last = h->e[i].name; }
    }
    if (h->n && lo != 0)
        return xent_set_error(XENT_ERR_FORMAT, "%s: the data block starts with %lld bytes no tensor uses "
                          "(the first, '%s', begins at %lld)", s->path, (long long)lo, first, (long long)lo);
    if ((uint64_t)hi != data_size)
        return xent_set_error(XENT_ERR_FORMAT, "%s: %llu bytes after the last tensor%s%s%s are not covered by "
                          "any tensor (data block %llu bytes, tensors end at %lld)", s->path,
                          (unsigned long long)(data_size - (uint64_t)hi), last ? " ('" : "",
                          last ? last : "", last ? "')" : "", (unsigned long long)data_size, (long long)hi);
    return XENT_OK;
}

static xent_status check_metadata(const xent__src *s, const xent_json *j,
                                  const xent_json_node *m) {
    if (m->type != XENT_JSON_OBJ)
        return xent_set_error(XENT_ERR_FORMAT, "%s: \"__metadata__\" is not an object", s->path);
    for (int64_t c = m->first; c >= 0; c = j->nodes[c].next)
        if (j->nodes[c].type != XENT_JSON_STR)
            return xent_set_error(XENT_ERR_FORMAT, "%s: __metadata__ value '%s' is not a string", s->path,
                              j->nodes[c].key);
    return XENT_OK;
}

/* Entries of the root object, checked one by one; duplicates refused. */
static xent_status parse_entries(const xent__src *s, st_header *h, uint64_t data_size) {
    const xent_json *j = &h->json;
    const xent_json_node *root = &j->nodes[0];
    if (root->type != XENT_JSON_OBJ)
        return xent_set_error(XENT_ERR_FORMAT, "%s: the header is not a JSON object", s->path);
    h->e = calloc((size_t)(root->count ? root->count : 1), sizeof *h->e);
    if (!h->e) return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", s->path);
    int seen_meta = 0;
    for (int64_t c = root->first; c >= 0; c = j->nodes[c].next) {
        const xent_json_node *v = &j->nodes[c];
        if (v->key_len == 12 && !memcmp(v->key, "__metadata__", 12)) {
            if (seen_meta++) return xent_set_error(XENT_ERR_FORMAT, "%s: duplicate \"__metadata__\"", s->path);
            xent_status st = check_metadata(s, j, v);
            if (st) return st;
            continue;
        }
        if (h->n == INT32_MAX) return xent_set_error(XENT_ERR_FORMAT, "%s: too many tensors", s->path);
        xent_status st = parse_entry(s, j, v, data_size, &h->e[h->n]);
        if (st) return st;
        h->n++;
    }
    xent_status st = check_overlap(s, h);
    if (!st) st = check_coverage(s, h, data_size);
    return st;
}

static xent_status read_header(const xent__src *s, st_header *h) {
    memset(h, 0, sizeof *h);
    unsigned char b[8];
    if (s->size < 8)
        return xent_set_error(XENT_ERR_FORMAT, "%s: truncated: %llu bytes, a safetensors file starts with an "
                          "8-byte header length", s->path, (unsigned long long)s->size);
    xent_status st = xent__src_read(s, 0, b, 8);
    if (st) return st;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
    if (n > s->size - 8)
        return xent_set_error(XENT_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%llu bytes)",
                          s->path, (unsigned long long)n, (unsigned long long)s->size);
    if (n > XENT__ST_MAX_HEADER)
        return xent_set_error(XENT_ERR_FORMAT, "%s: header length %llu exceeds the limit of %llu bytes", s->path,
                          (unsigned long long)n, (unsigned long long)XENT__ST_MAX_HEADER);
    if (n < 2) return xent_set_error(XENT_ERR_FORMAT, "%s: header length %llu is too short for a JSON object",
                                 s->path, (unsigned long long)n);
    h->text = malloc((size_t)n);
    if (!h->text) return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory for a %llu-byte header", s->path,
                                    (unsigned long long)n);
    st = xent__src_read(s, 8, h->text, n);
    if (!st) st = xent_json_parse(h->text, (size_t)n, s->path, &h->json);
    h->data_start = 8 + n;
    if (!st) st = parse_entries(s, h, s->size - h->data_start);
    if (st) header_free(h);
    return st;
}

/* Names of up to 4 tensors, for a "which one?" message. */
static void some_names(const st_header *h, char *buf, size_t cap) {
    buf[0] = '\0';
    for (int i = 0; i < h->n && i < 4; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, cap - used, "%s'%.60s'", i ? ", " : "", h->e[i].name);
    }
    if (h->n > 4) {
        size_t used = strlen(buf);
        snprintf(buf + used, cap - used, ", ...");
    }
}

static xent_status read_entry(const xent__src *s, const st_header *h,
                              const st_entry *e, xent_tensor *out) {
    if (e->xdtype < 0)
        return xent_set_error(XENT_ERR_DTYPE, "%s: tensor '%s': dtype %s is not supported "
                          "(F32, BF16, F16, F64, I32, I64, U8)", s->path, e->name, e->dtype);
    xent_tensor t;
    memset(&t, 0, sizeof t);
    strcpy(t.name, e->name);
    t.dtype = (xent_dtype)e->xdtype;
    t.ndim = e->ndim;
    memcpy(t.shape, e->shape, sizeof t.shape);
    t.nbytes = (size_t)(e->end - e->begin); /* <= the file size (checked)  */
    t.data = malloc(t.nbytes ? t.nbytes : 1);
    if (!t.data) return xent_set_error(XENT_ERR_ALLOC, "%s: tensor '%s': out of memory for %zu bytes",
                                   s->path, e->name, t.nbytes);
    xent_status st = xent__src_read(s, h->data_start + (uint64_t)e->begin, t.data, t.nbytes);
    if (st) { free(t.data); return st; }
    *out = t;
    return XENT_OK;
}

xent_status xent__st_load(const xent__src *s, const char *name, xent_tensor *out) {
    st_header h;
    xent_status st = read_header(s, &h);
    if (st) return st;
    char names[400];
    const st_entry *e = NULL;
    if (!name) {
        if (h.n == 1) e = &h.e[0];
        else if (h.n == 0) st = xent_set_error(XENT_ERR_NOT_FOUND, "%s: holds no tensors", s->path);
        else {
            some_names(&h, names, sizeof names);
            st = xent_set_error(XENT_ERR_NOT_FOUND, "%s: holds %d tensors; name one as FILE:NAME (%s)",
                            s->path, h.n, names);
        }
    } else {
        for (int i = 0; i < h.n && !e; i++)
            if (!strcmp(h.e[i].name, name)) e = &h.e[i];
        if (!e) {
            some_names(&h, names, sizeof names);
            st = xent_set_error(XENT_ERR_NOT_FOUND, "%s: no tensor '%s' (it holds %s)", s->path, name,
                            h.n ? names : "none");
        }
    }
    if (e) st = read_entry(s, &h, e, out);
    header_free(&h);
    return st;
}

xent_status xent__st_list(const xent__src *s, xent_tensor **out, int *n) {
    st_header h;
    xent_status st = read_header(s, &h);
    if (st) return st;
    xent_tensor *ts = calloc((size_t)(h.n ? h.n : 1), sizeof *ts);
    if (!ts) { header_free(&h); return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", s->path); }
    for (int i = 0; i < h.n && !st; i++) {
        const st_entry *e = &h.e[i];
        if (e->xdtype < 0) {
            st = xent_set_error(XENT_ERR_DTYPE, "%s: tensor '%s': dtype %s is not supported", s->path,
                            e->name, e->dtype);
            break;
        }
        strcpy(ts[i].name, e->name);
        ts[i].dtype = (xent_dtype)e->xdtype;
        ts[i].ndim = e->ndim;
        memcpy(ts[i].shape, e->shape, sizeof ts[i].shape);
        ts[i].nbytes = (size_t)(e->end - e->begin);
    }
    if (st) { free(ts); header_free(&h); return st; }
    *out = ts;
    *n = h.n;
    header_free(&h);
    return XENT_OK;
}

static int cmp_name_key(const void *key, const void *elt) {
    return strcmp((const char *)key, (*(const st_entry *const *)elt)->name);
}

xent_status xent__st_read_each(const xent__src *s, const char *const *names, int n,
                               xent_tensor_fn fn, void *ctx) {
    st_header h;
    xent_status st = read_header(s, &h);
    if (st) return st;
    /* names -> entries by binary search over the entries sorted by name:
     * O((n + entries) log entries), one header parse for all */
    const st_entry **byname = malloc((size_t)(h.n ? h.n : 1) * sizeof *byname);
    const st_entry **pick = malloc((size_t)(n > 0 ? n : 1) * sizeof *pick);
    if (!byname || !pick) st = xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", s->path);
    for (int i = 0; !st && i < h.n; i++) byname[i] = &h.e[i];
    if (!st && h.n > 1) qsort(byname, (size_t)h.n, sizeof *byname, cmp_name);
    for (int i = 0; !st && i < n; i++) {
        const st_entry **e = h.n ? bsearch(names[i], byname, (size_t)h.n, sizeof *byname, cmp_name_key) : NULL;
        if (!e) st = xent_set_error(XENT_ERR_NOT_FOUND, "%s: no tensor '%s'", s->path, names[i]);
        else pick[i] = *e;
    }
    for (int i = 0; !st && i < n; i++) {
        xent_tensor t;
        st = read_entry(s, &h, pick[i], &t);
        if (st) break;
        st = fn(ctx, i, &t);
        xent_tensor_free(&t);
    }
    free(byname);
    free(pick);
    header_free(&h);
    return st;
}

/* ---- writer ------------------------------------------------------------ */

typedef struct sbuf { char *p; size_t n, cap; int oom; } sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* A JSON string literal of s. */
static void sb_json_str(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') { esc[0] = '\\'; esc[1] = (char)c; sb_put(b, esc, 2); }
        else if (c < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", c); sb_str(b, esc); }
        else sb_put(b, (const char *)&c, 1);
    }
    sb_put(b, "\"", 1);
}

static void write_le64(unsigned char *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

xent_status xent__st_save(const char *path, const xent_tensor *ts, int n) {
    sbuf b = {0};
    uint64_t off = 0;
    sb_str(&b, "{");
    for (int i = 0; i < n; i++) {
        const char *dt = st_name_of(ts[i].dtype);
        char tmp[64];
        if (i) sb_str(&b, ",");
        sb_json_str(&b, ts[i].name);
        sb_str(&b, ":{\"dtype\":\"");
        sb_str(&b, dt);
        sb_str(&b, "\",\"shape\":[");
        for (int d = 0; d < ts[i].ndim; d++) {
            snprintf(tmp, sizeof tmp, "%s%lld", d ? "," : "", (long long)ts[i].shape[d]);
            sb_str(&b, tmp);
        }
        snprintf(tmp, sizeof tmp, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + ts[i].nbytes));
        sb_str(&b, tmp);
        off += ts[i].nbytes;
    }
    sb_str(&b, "}");
    while (b.n % 8) sb_put(&b, " ", 1); /* data block 8-byte aligned */
    if (b.oom) { free(b.p); return xent_set_error(XENT_ERR_ALLOC, "%s: out of memory", path); }
    char *tmpname = NULL;
    FILE *f = xent_file_create(path, &tmpname);
    if (!f) {
        free(b.p);
        return XENT_ERR_IO;
    }
    unsigned char len[8];
    write_le64(len, b.n);
    int ok = fwrite(len, 1, 8, f) == 8 && fwrite(b.p, 1, b.n, f) == b.n;
    for (int i = 0; i < n && ok; i++)
        ok = ts[i].nbytes == 0 || fwrite(ts[i].data, 1, ts[i].nbytes, f) == ts[i].nbytes;
    free(b.p);
    return xent_file_commit(f, tmpname, path, ok);
}
