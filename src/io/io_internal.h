/* src/io/io_internal.h: private pieces of the tensor file readers/writers.
 *
 * A reader works on an xent__src: either an open FILE or a memory buffer
 * (the memory form is what the fuzz targets use). Every read is checked
 * against the source's real size before it happens. */
#ifndef XENT_IO_INTERNAL_H
#define XENT_IO_INTERNAL_H

#include "core/xent_internal.h"

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

/* ---- format-specific readers on a source ------------------------------- */

/* Loads tensor `name` (NULL: the only tensor) of a safetensors source. */
xent_status xent__st_load(const xent__src *s, const char *name,
                          xent_tensor *out);
/* Lists the tensors of a safetensors source (data NULL); *out malloc'ed. */
xent_status xent__st_list(const xent__src *s, xent_tensor **out, int *n);
/* Reads the named tensors with one header parse (xent_safetensors_read). */
xent_status xent__st_read_each(const xent__src *s, const char *const *names, int n,
                               xent_tensor_fn fn, void *ctx);
/* Loads the array of a .npy source. */
xent_status xent__npy_load(const xent__src *s, xent_tensor *out);

/* Writers: one safetensors file with all tensors; one .npy file. */
xent_status xent__st_save(const char *path, const xent_tensor *ts, int n);
xent_status xent__npy_save(const char *path, const xent_tensor *t);
/* The whole .npy image of t to f; 0 when a write failed. */
int xent__npy_write(FILE *f, const xent_tensor *t);

#endif
