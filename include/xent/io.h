/* xent/io.h: tensors from and to .safetensors and .npy files, outputs
 * written atomically, and the strict JSON reader.
 * Included by xent.h; do not include directly.
 *
 * Every reader validates the whole header and every offset and size against
 * the file's real length before touching data: a truncated, corrupted or
 * hostile file gives XENT_ERR_FORMAT with a message naming the tensor or the
 * field, never a crash or an out-of-bounds read. */
#ifndef XENT_IO_H
#define XENT_IO_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XENT_MAX_DIMS 8
#define XENT_MAX_NAME 256

typedef struct xent_tensor {
    char name[XENT_MAX_NAME]; /* tensor name ("" for a .npy file)           */
    xent_dtype dtype;
    int ndim;
    int64_t shape[XENT_MAX_DIMS];
    void *data;               /* owned by the tensor: xent_tensor_free()    */
    size_t nbytes;
} xent_tensor;

/* Product of the shape (1 for ndim 0); -1 if it overflows or a dim is < 0. */
XENT_API int64_t xent_tensor_numel(const xent_tensor *t);
XENT_API void xent_tensor_free(xent_tensor *t); /* frees data, zeroes *t; NULL ok     */

/* Loads one tensor. `spec` is "FILE" or "FILE:NAME" (a spec that names an
 * existing file is always FILE; otherwise the first ':' whose prefix is a
 * file splits it). A .npy file holds one unnamed array: "X.npy:NAME" loads
 * X.NAME.npy, the file xent_tensors_save writes for tensor NAME. A
 * .safetensors file needs NAME unless it holds exactly one tensor. The file
 * type is taken from the extension, else from the magic bytes. Supported
 * dtypes: F32, BF16, F16, F64, I32, I64, U8 (safetensors; other known dtypes
 * give XENT_ERR_DTYPE naming the tensor); <f4 <f2 <f8 <i4 <i8 |u1 (npy
 * versions 1.0-3.0, C order, little-endian) and '<V2' as bf16 (ml_dtypes.bfloat16
 * arrays are saved so; '|V2' and '<u2' are refused).
 * On failure *out is untouched. */
XENT_API xent_status xent_tensor_load(const char *spec, xent_tensor *out);

/* Writes n tensors. PATH ending in .safetensors: one file with all of them.
 * PATH ending in .npy: n == 1 writes PATH; n > 1 writes PATH with ".NAME"
 * inserted before ".npy" for each tensor (out.npy -> out.nll.npy, ...).
 * bf16 tensors are written to .npy as float32 (numpy has no bfloat16). */
XENT_API xent_status xent_tensors_save(const char *path, const xent_tensor *ts, int n);

/* Lists the tensors of a .safetensors file (names, dtypes, shapes; data is
 * NULL). *out is malloc'ed; free it with free(). */
XENT_API xent_status xent_safetensors_list(const char *path, xent_tensor **out,
                                  int *n);

/* ---- Outputs that are complete or absent ------------------------------ */

/* Every file xent writes goes through these: the data is written to
 * PATH.tmp.XXXXXX beside PATH, flushed to disk (fsync) and renamed over PATH
 * only once complete, so a failure never leaves a half-written PATH nor
 * removes an existing one. xent_file_create returns the stream (NULL: failed,
 * message set) and the temporary name in *tmp; xent_file_commit closes it and
 * renames it into place (ok != 0) or removes it (ok == 0, or a write, flush
 * or close error), frees *tmp and returns the status. */
XENT_API FILE *xent_file_create(const char *path, char **tmp);
XENT_API xent_status xent_file_commit(FILE *f, char *tmp, const char *path, int ok);

/* ---- Strict JSON (RFC 8259) --------------------------------------------- */

/* The reader of the safetensors header, Hugging Face config.json and the
 * JSON dumps. Bounded: at most 64 levels of nesting and 2^22 values. */
typedef enum xent_json_type {
    XENT_JSON_NULL, XENT_JSON_FALSE, XENT_JSON_TRUE, XENT_JSON_NUM, XENT_JSON_STR,
    XENT_JSON_ARR, XENT_JSON_OBJ
} xent_json_type;

/* A parsed value. Children of arrays/objects are a linked list through
 * `next` (indices into the node array; -1 ends it). Strings (values and
 * keys) are decoded UTF-8 with explicit lengths (they may hold NUL bytes);
 * numbers keep their text. */
typedef struct xent_json_node {
    xent_json_type type;
    int64_t first, next; /* first child; next sibling (-1: none)           */
    int64_t count;       /* number of children                             */
    const char *key;     /* object member name (decoded), or NULL          */
    size_t key_len;
    const char *str;     /* decoded string, or number text                 */
    size_t len;
} xent_json_node;

typedef struct xent_json {
    xent_json_node *nodes; /* [n]; nodes[0] is the root                   */
    int64_t n, cap;
    char *strbuf;          /* decoded strings                             */
    size_t strlen_, strcap;
} xent_json;

/* Parses text[0..len) (whitespace around the value allowed, nothing else).
 * On failure: XENT_ERR_FORMAT with "what: ..." naming the byte offset. */
XENT_API xent_status xent_json_parse(const char *text, size_t len, const char *what,
                            xent_json *out);
XENT_API void xent_json_free(xent_json *j);
/* Member `key` of object node `obj`, or NULL (the first one when a key is
 * repeated). */
XENT_API const xent_json_node *xent_json_get(const xent_json *j, const xent_json_node *obj,
                                    const char *key);
/* Number node -> non-negative integer (digits only, <= 2^63-1); 0 if not. */
XENT_API int xent_json_uint(const xent_json_node *n, int64_t *out);

/* ---- Inputs that cannot hang ------------------------------------------- */

/* Opens PATH for reading only if it is a regular file: a FIFO, a device, a
 * socket or a directory is refused (XENT_ERR_IO, "PATH: not a regular file
 * (a FIFO)") without blocking, before any byte is read. *size (may be NULL)
 * receives the file's size. NULL on failure, message set. Every reader of
 * xent and its tools opens its inputs through this. */
XENT_API FILE *xent_file_open(const char *path, uint64_t *size);

/* Reads the tensors names[0..n) of a .safetensors file with one pass over
 * its header: for each i in order, fn(ctx, i, &t) gets the tensor with its
 * data, valid during the call only (one tensor in memory at a time). A
 * name the file lacks is XENT_ERR_NOT_FOUND naming it, before any data is
 * read; fn's non-zero status stops the pass and is returned. */
typedef xent_status (*xent_tensor_fn)(void *ctx, int i, const xent_tensor *t);
XENT_API xent_status xent_safetensors_read(const char *path,
                                           const char *const *names, int n,
                                           xent_tensor_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif /* XENT_IO_H */
