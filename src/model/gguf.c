/* src/model/gguf.c: GGUF parsing (memory image), dequantization, and the
 * model loader / writer on top of it. */
#include "model/gguf.h"
#include "model/model_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */

typedef struct {
    const xent__gguf *g;
    uint64_t pos;
} cur;

/* n more bytes available at the cursor (no overflow: compares remaining). */
static int avail(const cur *c, uint64_t n) {
    return c->pos <= c->g->size && n <= c->g->size - c->pos;
}

static xent_status rd(cur *c, void *dst, uint64_t n, const char *what) {
    if (!avail(c, n))
        return xent_set_error(XENT_ERR_FORMAT,
                          "gguf: truncated reading %s at byte %llu (file has "
                          "%llu bytes)", what, (unsigned long long)c->pos,
                          (unsigned long long)c->g->size);
    memcpy(dst, c->g->p + c->pos, (size_t)n);
    c->pos += n;
    return XENT_OK;
}

static xent_status rd_str(cur *c, const char **s, uint64_t *len,
                          const char *what) {
    uint64_t n = 0;
    xent_status st = rd(c, &n, 8, what);
    if (st) return st;
    if (!avail(c, n))
        return xent_set_error(XENT_ERR_FORMAT,
                          "gguf: %s: string length %llu at byte %llu runs past "
                          "the end of the file", what, (unsigned long long)n,
                          (unsigned long long)(c->pos - 8));
    *s = (const char *)c->g->p + c->pos;
    *len = n;
    c->pos += n;
    return XENT_OK;
}

static uint64_t scalar_size(uint32_t t) {
    static const uint64_t sz[XENT__GT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1,
                                                0, 0, 8, 8, 8};
    return t < XENT__GT_COUNT ? sz[t] : 0;
}

/* Skips one value of type t (scalars, strings; arrays handled by caller). */
static xent_status skip_value(cur *c, uint32_t t, const char *key) {
    if (t == XENT__GT_STR) {
        const char *s;
        uint64_t n;
        return rd_str(c, &s, &n, key);
    }
    uint64_t n = scalar_size(t);
    if (!n)
        return xent_set_error(XENT_ERR_FORMAT, "gguf: key '%s': unknown value "
                          "type %u", key, t);
    if (!avail(c, n))
        return xent_set_error(XENT_ERR_FORMAT, "gguf: key '%s': value truncated",
                          key);
    c->pos += n;
    return XENT_OK;
}

static void key_copy(char *dst, size_t cap, const char *s, uint64_t n) {
    size_t k = n < cap - 1 ? (size_t)n : cap - 1;
    memcpy(dst, s, k);
    dst[k] = 0;
    for (size_t i = 0; i < k; i++)
        if ((unsigned char)dst[i] < 32 || (unsigned char)dst[i] > 126)
            dst[i] = '?';
}

static xent_status parse_kv(cur *c, xent__gguf_kv *kv, int64_t i) {
    char what[64];
    snprintf(what, sizeof what, "metadata key %lld", (long long)i);
    xent_status st = rd_str(c, &kv->key, &kv->klen, what);
    if (st) return st;
    char key[128];
    key_copy(key, sizeof key, kv->key, kv->klen);
    if ((st = rd(c, &kv->type, 4, key))) return st;
    kv->n = 1;
    kv->atype = kv->type;
    if (kv->type != XENT__GT_ARR) {
        kv->off = c->pos;
        return skip_value(c, kv->type, key);
    }
    if ((st = rd(c, &kv->atype, 4, key)) || (st = rd(c, &kv->n, 8, key)))
        return st;
    kv->off = c->pos;
    if (kv->atype == XENT__GT_STR) {
        /* each string takes at least 8 bytes: bound the count first */
        if (kv->n > (c->g->size - c->pos) / 8)
            return xent_set_error(XENT_ERR_FORMAT,
                              "gguf: key '%s': array of %llu strings does not "
                              "fit in the file", key,
                              (unsigned long long)kv->n);
        for (uint64_t j = 0; j < kv->n; j++)
            if ((st = skip_value(c, XENT__GT_STR, key))) return st;
        return XENT_OK;
    }
    uint64_t es = scalar_size(kv->atype);
    if (!es)
        return xent_set_error(XENT_ERR_FORMAT,
                          "gguf: key '%s': unsupported array element type %u",
                          key, kv->atype);
    if (kv->n > (c->g->size - c->pos) / es)
        return xent_set_error(XENT_ERR_FORMAT,
                          "gguf: key '%s': array of %llu elements runs past the "
                          "end of the file", key, (unsigned long long)kv->n);
    c->pos += kv->n * es;
    return XENT_OK;
}

uint64_t xent__gguf_nbytes(uint32_t type, int64_t n) {
    if (n < 0) return 0;
    uint64_t u = (uint64_t)n;
    switch (type) {
    case XENT__GG_F32: return u * 4;
    case XENT__GG_F16:
    case XENT__GG_BF16: return u * 2;
    case XENT__GG_Q8_0: return u % 32 ? 0 : u / 32 * 34;
    case XENT__GG_Q4_0: return u % 32 ? 0 : u / 32 * 18;
    case XENT__GG_Q4_1: return u % 32 ? 0 : u / 32 * 20;
    default: return 0;
    }
}

static const char *type_name(uint32_t t) {
    switch (t) {
    case XENT__GG_F32: return "F32";
    case XENT__GG_F16: return "F16";
    case XENT__GG_BF16: return "BF16";
    case XENT__GG_Q8_0: return "Q8_0";
    case XENT__GG_Q4_0: return "Q4_0";
    case XENT__GG_Q4_1: return "Q4_1";
    default: return NULL;
    }
}

static xent_status parse_tensor(cur *c, xent__gguf_tensor *t, int64_t i) {
    char what[64];
    snprintf(what, sizeof what, "tensor info %lld", (long long)i);
    const char *s;
    uint64_t n;
    xent_status st = rd_str(c, &s, &n, what);
    if (st) return st;
    if (n >= sizeof t->name)
        return xent_set_error(XENT_ERR_FORMAT, "gguf: %s: name of %llu bytes is "
                          "too long", what, (unsigned long long)n);
    key_copy(t->name, sizeof t->name, s, n);
    if ((st = rd(c, &t->ndim, 4, t->name))) return st;
    if (t->ndim < 1 || t->ndim > 4)
        return xent_set_error(XENT_ERR_FORMAT, "gguf: tensor '%s': n_dims = %u is "
                          "outside [1, 4]", t->name, t->ndim);
    t->numel = 1;
    for (uint32_t d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->ndim; d++) {
        uint64_t e;
        if ((st = rd(c, &e, 8, t->name))) return st;
        if (e == 0 || e > ((uint64_t)1 << 40) ||
            (uint64_t)t->numel > (((uint64_t)1 << 62) / e))
            return xent_set_error(XENT_ERR_FORMAT, "gguf: tensor '%s': dim %u = "
                              "%llu is out of range", t->name, d,
                              (unsigned long long)e);
        t->ne[d] = (int64_t)e;
        t->numel *= (int64_t)e;
    }
    if ((st = rd(c, &t->type, 4, t->name)) || (st = rd(c, &t->off, 8, t->name)))
        return st;
    if (!type_name(t->type))
        return xent_set_error(XENT_ERR_FORMAT, "gguf: tensor '%s': ggml type %u is "
                          "not supported (F32, F16, BF16, Q8_0, Q4_0, Q4_1)",
                          t->name, t->type);
    t->nbytes = xent__gguf_nbytes(t->type, t->numel);
    if (!t->nbytes)
        return xent_set_error(XENT_ERR_FORMAT, "gguf: tensor '%s': %lld elements "
                          "is not a whole number of %s blocks", t->name,
                          (long long)t->numel, type_name(t->type));
    return XENT_OK;
}

/* Duplicate detection: pointers into one table, sorted by name and then by
 * address (= index), so equal names sit next to each other, first
 * occurrence first. O(n log n). */
static int kv_cmp(const void *a, const void *b) {
    const xent__gguf_kv *x = *(const xent__gguf_kv *const *)a,
                        *y = *(const xent__gguf_kv *const *)b;
    uint64_t n = x->klen < y->klen ? x->klen : y->klen;
    int r = n ? memcmp(x->key, y->key, (size_t)n) : 0;
    if (r) return r;
    if (x->klen != y->klen) return x->klen < y->klen ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int tensor_cmp(const void *a, const void *b) {
    const xent__gguf_tensor *x = *(const xent__gguf_tensor *const *)a,
                            *y = *(const xent__gguf_tensor *const *)b;
    int r = strcmp(x->name, y->name);
    if (r) return r;
    return x < y ? -1 : x > y;
}

static xent_status check_unique_keys(const xent__gguf *g) {
    if (g->n_kv < 2) return XENT_OK;
    const xent__gguf_kv **s = malloc((size_t)g->n_kv * sizeof *s);
    if (!s) return xent_set_error(XENT_ERR_ALLOC, "gguf: key index");
    for (int64_t i = 0; i < g->n_kv; i++) s[i] = &g->kv[i];
    qsort(s, (size_t)g->n_kv, sizeof *s, kv_cmp);
    xent_status st = XENT_OK;
    for (int64_t i = 1; i < g->n_kv; i++) {
        const xent__gguf_kv *a = s[i - 1], *b = s[i];
        if (a->klen == b->klen && !memcmp(a->key, b->key, (size_t)a->klen)) {
            /* the first pair of this name (sorted by index within it) */
            char key[128];
            key_copy(key, sizeof key, a->key, a->klen);
            st = xent_set_error(XENT_ERR_FORMAT, "gguf: metadata key '%s' appears "
                            "twice (keys %lld and %lld)", key,
                            (long long)(a - g->kv), (long long)(b - g->kv));
            break;
        }
    }
    free(s);
    return st;
}

static xent_status check_unique_tensors(const xent__gguf *g) {
    if (g->n_tensors < 2) return XENT_OK;
    const xent__gguf_tensor **s = malloc((size_t)g->n_tensors * sizeof *s);
    if (!s) return xent_set_error(XENT_ERR_ALLOC, "gguf: tensor index");
    for (int64_t i = 0; i < g->n_tensors; i++) s[i] = &g->tensors[i];
    qsort(s, (size_t)g->n_tensors, sizeof *s, tensor_cmp);
    xent_status st = XENT_OK;
    for (int64_t i = 1; i < g->n_tensors; i++)
        if (!strcmp(s[i - 1]->name, s[i]->name)) {
            st = xent_set_error(XENT_ERR_FORMAT, "gguf: tensor '%s' appears twice "
                            "(tensor infos %lld and %lld)", s[i]->name,
                            (long long)(s[i - 1] - g->tensors),
                            (long long)(s[i] - g->tensors));
            break;
        }
    free(s);
    return st;
}

void xent__gguf_free(xent__gguf *g) {
    if (!g) return;
    free(g->kv);
    free(g->tensors);
    g->kv = NULL;
    g->tensors = NULL;
}

xent_status xent__gguf_parse(const uint8_t *p, uint64_t size, xent__gguf *g) {
    memset(g, 0, sizeof *g);
    g->p = p;
    g->size = size;
    cur c = {g, 0};
    uint32_t magic;
    uint64_t nt, nkv;
    xent_status st;
    if ((st = rd(&c, &magic, 4, "magic"))) return st;
    if (magic != GGUF_MAGIC)
        return xent_set_error(XENT_ERR_FORMAT, "gguf: bad magic 0x%08x (not a "
                          "GGUF file)", magic);
    if ((st = rd(&c, &g->version, 4, "version"))) return st;
    if (g->version != 2 && g->version != 3)
        return xent_set_error(XENT_ERR_FORMAT, "gguf: version %u is not supported "
                          "(2, 3)", g->version);
    if ((st = rd(&c, &nt, 8, "n_tensors")) || (st = rd(&c, &nkv, 8, "n_kv")))
        return st;
    /* a key-value pair takes >= 13 bytes, a tensor info >= 28 */
    if (nkv > size / 13)
        return xent_set_error(XENT_ERR_FORMAT, "gguf: n_kv = %llu cannot fit in "
                          "%llu bytes", (unsigned long long)nkv,
                          (unsigned long long)size);
    if (nt > size / 28)
        return xent_set_error(XENT_ERR_FORMAT, "gguf: n_tensors = %llu cannot fit "
                          "in %llu bytes", (unsigned long long)nt,
                          (unsigned long long)size);
    g->n_kv = (int64_t)nkv;
    g->n_tensors = (int64_t)nt;
    g->kv = calloc((size_t)nkv + 1, sizeof *g->kv);
    g->tensors = calloc((size_t)nt + 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        xent__gguf_free(g);
        return xent_set_error(XENT_ERR_ALLOC, "gguf: tables");
    }
    for (int64_t i = 0; i < g->n_kv; i++)
        if ((st = parse_kv(&c, &g->kv[i], i))) goto fail;
    if ((st = check_unique_keys(g))) goto fail;
    for (int64_t i = 0; i < g->n_tensors; i++)
        if ((st = parse_tensor(&c, &g->tensors[i], i))) goto fail;
    if ((st = check_unique_tensors(g))) goto fail;
    int64_t al = 32;
    const xent__gguf_kv *a = xent__gguf_find(g, "general.alignment");
    if (a && (!xent__gguf_int(g, "general.alignment", &al) || al <= 0 ||
              al > 65536 || (al & (al - 1)))) {
        st = xent_set_error(XENT_ERR_FORMAT, "gguf: general.alignment is not a "
                        "power of two in [1, 65536]");
        goto fail;
    }
    g->alignment = (uint64_t)al;
    g->data_off = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (g->data_off > size && g->n_tensors > 0) {
        st = xent_set_error(XENT_ERR_FORMAT, "gguf: the data section (byte %llu) starts past the end "
                            "of the file (%llu bytes)", (unsigned long long)g->data_off,
                            (unsigned long long)size);
        goto fail;
    }
    /* llama.cpp's rule: the tensors' data lie in the order of their infos,
     * each at the running offset (the previous end rounded up to the
     * alignment): sequential, aligned, never overlapping, so the bytes the
     * tensors claim are bytes the file has (a file of N bytes cannot make
     * the loader allocate more than ~7 N bytes of fp32 weights) */
    uint64_t want = 0;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        xent__gguf_tensor *t = &g->tensors[i];
        if (t->off != want) {
            st = xent_set_error(XENT_ERR_FORMAT, "gguf: tensor '%s' (info %lld): data offset %llu, "
                                "expected %llu (tensor data must be sequential, %llu-byte aligned and "
                                "non-overlapping, as llama.cpp requires)", t->name, (long long)i,
                                (unsigned long long)t->off, (unsigned long long)want,
                                (unsigned long long)g->alignment);
            goto fail;
        }
        if (t->nbytes > size - g->data_off || t->off > size - g->data_off - t->nbytes) {
            st = xent_set_error(XENT_ERR_FORMAT, "gguf: tensor '%s': data at offset %llu (+%llu bytes) "
                                "runs past the end of the file (%llu bytes)", t->name,
                                (unsigned long long)t->off, (unsigned long long)t->nbytes,
                                (unsigned long long)size);
            goto fail;
        }
        /* in the file, so this cannot overflow */
        want = t->off + (t->nbytes + g->alignment - 1) / g->alignment * g->alignment;
        t->off += g->data_off;
    }
    return XENT_OK;
fail:
    xent__gguf_free(g);
    return st;
}

const xent__gguf_kv *xent__gguf_find(const xent__gguf *g, const char *key) {
    size_t n = strlen(key);
    for (int64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].klen == n && !memcmp(g->kv[i].key, key, n))
            return &g->kv[i];
    return NULL;
}

static int kv_num(const xent__gguf *g, const xent__gguf_kv *kv, double *d,
                  int64_t *i) {
    if (!kv || kv->type == XENT__GT_ARR || kv->type == XENT__GT_STR) return 0;
    const uint8_t *p = g->p + kv->off;
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32;
            int32_t i32; float f32; uint64_t u64; int64_t i64; double f64; } v;
    memcpy(&v, p, (size_t)scalar_size(kv->type));
    switch (kv->type) {
    case XENT__GT_U8: case XENT__GT_BOOL: *i = v.u8; *d = v.u8; break;
    case XENT__GT_I8: *i = v.i8; *d = v.i8; break;
    case XENT__GT_U16: *i = v.u16; *d = v.u16; break;
    case XENT__GT_I16: *i = v.i16; *d = v.i16; break;
    case XENT__GT_U32: *i = v.u32; *d = v.u32; break;
    case XENT__GT_I32: *i = v.i32; *d = v.i32; break;
    case XENT__GT_F32: *d = v.f32; *i = 0; break;
    case XENT__GT_U64:
        if (v.u64 > (uint64_t)INT64_MAX) return 0;
        *i = (int64_t)v.u64; *d = (double)v.u64; break;
    case XENT__GT_I64: *i = v.i64; *d = (double)v.i64; break;
    case XENT__GT_F64: *d = v.f64; *i = 0; break;
    default: return 0;
    }
    if (kv->type == XENT__GT_F32 || kv->type == XENT__GT_F64) {
        if (!(*d > -9e18 && *d < 9e18)) return 0; /* NaN too */
        *i = (int64_t)*d;
    }
    return 1;
}

int xent__gguf_int(const xent__gguf *g, const char *key, int64_t *out) {
    double d;
    return kv_num(g, xent__gguf_find(g, key), &d, out);
}

int xent__gguf_f64(const xent__gguf *g, const char *key, double *out) {
    int64_t i;
    return kv_num(g, xent__gguf_find(g, key), out, &i);
}

int xent__gguf_str(const xent__gguf *g, const char *key, const char **s,
                   uint64_t *len) {
    const xent__gguf_kv *kv = xent__gguf_find(g, key);
    if (!kv || kv->type != XENT__GT_STR) return 0;
    memcpy(len, g->p + kv->off, 8);
    *s = (const char *)g->p + kv->off + 8;
    return 1;
}

const xent__gguf_tensor *xent__gguf_tensor_find(const xent__gguf *g,
                                                const char *name) {
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static float ld_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return xent__f16_f32(h);
}

xent_status xent__gguf_dequant(uint32_t type, const uint8_t *src, int64_t n,
                               float *dst) {
    if (!xent__gguf_nbytes(type, n))
        return xent_set_error(XENT_ERR_FORMAT, "gguf: cannot dequantize %lld "
                          "elements of type %u", (long long)n, type);
    switch (type) {
    case XENT__GG_F32: memcpy(dst, src, (size_t)n * 4); break;
    case XENT__GG_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = ld_f16(src + 2 * i);
        break;
    case XENT__GG_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = xent__bf16_f32(h);
        }
        break;
    case XENT__GG_Q8_0: /* f16 d, int8 q[32]: q * d */
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = src + b * 34;
            float d = ld_f16(blk);
            for (int j = 0; j < 32; j++)
                dst[b * 32 + j] = (float)(int8_t)blk[2 + j] * d;
        }
        break;
    case XENT__GG_Q4_0: /* f16 d, 16 bytes: low nibbles 0..15, high 16..31 */
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = src + b * 18;
            float d = ld_f16(blk);
            for (int j = 0; j < 16; j++) {
                dst[b * 32 + j] = (float)((blk[2 + j] & 0xF) - 8) * d;
                dst[b * 32 + j + 16] = (float)((blk[2 + j] >> 4) - 8) * d;
            }
        }
        break;
    case XENT__GG_Q4_1: /* f16 d, f16 m, 16 bytes: q * d + m */
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = src + b * 20;
            float d = ld_f16(blk), m = ld_f16(blk + 2);
            for (int j = 0; j < 16; j++) {
                dst[b * 32 + j] = (float)(blk[4 + j] & 0xF) * d + m;
                dst[b * 32 + j + 16] = (float)(blk[4 + j] >> 4) * d + m;
            }
        }
        break;
    default: break;
    }
    return XENT_OK;
}
