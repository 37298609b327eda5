/* src/io/io_internal.h: private pieces of the tensor file readers/writers.
 *
 * A reader works on an xent__src: either an open FILE or a memory buffer
 * (the memory form is what the fuzz targets use). Every read is checked
 * against the source's real size before it happens. */
#ifndef XENT_IO_INTERNAL_H
#define XENT_IO_INTERNAL_H

#include "xent_internal.h"

#include <stdint.h>
#include <stdio.h>

/* Limits that bound every allocation made from header fields. */
#define XENT__ST_MAX_HEADER ((uint64_t)100 << 20) /* safetensors JSON bytes */
#define XENT__JSON_MAX_DEPTH 64                 /* nesting of [ and {     */
#define XENT__JSON_MAX_NODES ((int64_t)1 << 22) /* values in one header   */
#define XENT__MAX_DIM ((int64_t)1 << 62)        /* one dimension's bound  */

typedef struct xent__src {
    FILE *f;                  /* file source, or NULL                      */
    const unsigned char *mem; /* [size] memory source when f is NULL       */
    uint64_t size;            /* bytes in the source                       */
    const char *path;         /* for messages ("<memory>" for buffers)     */
} xent__src;

/* Reads n bytes at offset off into buf; XENT_ERR_FORMAT when the range is
 * not inside the source, XENT_ERR_IO when the read fails. */
xent_status xent__src_read(const xent__src *s, uint64_t off, void *buf,
                           uint64_t n);

/* a * b into *out; returns 0 on overflow of int64_t (both must be >= 0). */
int xent__mul_i64(int64_t a, int64_t b, int64_t *out);

/* Product of dims into *numel (overflow- and sign-checked); the message on
 * failure names `what` (the tensor) and the offending dimension. */
xent_status xent__shape_numel(const xent__src *s, const char *what,
                              const int64_t *shape, int ndim, int64_t *numel);

/* ---- strict JSON (RFC 8259), for the safetensors header ---------------- */

typedef enum xent__jtype {
    XENT__J_NULL, XENT__J_FALSE, XENT__J_TRUE, XENT__J_NUM, XENT__J_STR,
    XENT__J_ARR, XENT__J_OBJ
} xent__jtype;

/* A parsed value. Children of arrays/objects are a linked list through
 * `next` (indices into the node array; -1 ends it). Strings (values and
 * keys) are decoded UTF-8 with explicit lengths; numbers keep their text. */
typedef struct xent__jnode {
    xent__jtype type;
    int64_t first, next; /* first child; next sibling (-1: none)           */
    int64_t count;       /* number of children                             */
    const char *key;     /* object member name (decoded), or NULL          */
    size_t key_len;
    const char *str;     /* decoded string, or number text                 */
    size_t len;
} xent__jnode;

typedef struct xent__json {
    xent__jnode *nodes; /* [n]; nodes[0] is the root                      */
    int64_t n, cap;
    char *strbuf;       /* decoded strings                                */
    size_t strlen_, strcap;
} xent__json;

/* Parses text[0..len) (whitespace around the value allowed, nothing else).
 * On failure: XENT_ERR_FORMAT with "what: ..." naming the byte offset. */
xent_status xent__json_parse(const char *text, size_t len, const char *what,
                             xent__json *out);
void xent__json_free(xent__json *j);
/* Member `key` of object node `obj`, or NULL. */
const xent__jnode *xent__json_get(const xent__json *j, const xent__jnode *obj,
                                  const char *key);
/* Number node -> non-negative integer (digits only, <= 2^63-1); 0 if not. */
int xent__json_uint(const xent__jnode *n, int64_t *out);

/* ---- format-specific readers on a source ------------------------------- */

/* Loads tensor `name` (NULL: the only tensor) of a safetensors source. */
xent_status xent__st_load(const xent__src *s, const char *name,
                          xent_tensor *out);
/* Lists the tensors of a safetensors source (data NULL); *out malloc'ed. */
xent_status xent__st_list(const xent__src *s, xent_tensor **out, int *n);
/* Loads the array of a .npy source. */
xent_status xent__npy_load(const xent__src *s, xent_tensor *out);

/* Writers: one safetensors file with all tensors; one .npy file. */
/* Writers never leave a half-written file, nor remove an existing one on
 * failure: they write PATH.tmp.XXXXXX beside PATH and rename it over PATH
 * once complete. xent__tmp_open returns the stream (NULL: failed, message
 * set) and the temporary name in *tmp; xent__tmp_close closes it and renames
 * it (ok) or removes it (!ok or a close error), and frees *tmp. */
FILE *xent__tmp_open(const char *path, char **tmp);
xent_status xent__tmp_close(FILE *f, char *tmp, const char *path, int ok);

xent_status xent__st_save(const char *path, const xent_tensor *ts, int n);
xent_status xent__npy_save(const char *path, const xent_tensor *t);

#endif
