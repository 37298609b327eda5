/* xent/io.h: tensors from and to .safetensors and .npy files.
 * Included by xent.h; do not include directly.
 *
 * Every reader validates the whole header and every offset and size against
 * the file's real length before touching data: a truncated, corrupted or
 * hostile file gives XENT_ERR_FORMAT with a message naming the tensor or the
 * field, never a crash or an out-of-bounds read. */
#ifndef XENT_IO_H
#define XENT_IO_H

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
int64_t xent_tensor_numel(const xent_tensor *t);
void xent_tensor_free(xent_tensor *t); /* frees data, zeroes *t; NULL ok     */

/* Loads one tensor. `spec` is "FILE" or "FILE:NAME" (a spec that names an
 * existing file is always FILE; otherwise the first ':' whose prefix is a
 * file splits it). A .npy file holds one unnamed array: "X.npy:NAME" loads
 * X.NAME.npy, the file xent_tensors_save writes for tensor NAME. A
 * .safetensors file needs NAME unless it holds exactly one tensor. The file
 * type is taken from the extension, else from the magic bytes. Supported
 * dtypes: F32, BF16, F16, F64, I32, I64, U8 (safetensors; other known dtypes
 * give XENT_ERR_DTYPE naming the tensor); <f4 <f2 <f8 <i4 <i8 |u1 (npy
 * versions 1.0-3.0, C order, little-endian; 'V2'/'<u2' is not read as bf16).
 * On failure *out is untouched. */
xent_status xent_tensor_load(const char *spec, xent_tensor *out);

/* Writes n tensors. PATH ending in .safetensors: one file with all of them.
 * PATH ending in .npy: n == 1 writes PATH; n > 1 writes PATH with ".NAME"
 * inserted before ".npy" for each tensor (out.npy -> out.nll.npy, ...).
 * bf16 tensors are written to .npy as float32 (numpy has no bfloat16). */
xent_status xent_tensors_save(const char *path, const xent_tensor *ts, int n);

/* Lists the tensors of a .safetensors file (names, dtypes, shapes; data is
 * NULL). *out is malloc'ed; free it with free(). */
xent_status xent_safetensors_list(const char *path, xent_tensor **out,
                                  int *n);

#ifdef __cplusplus
}
#endif
#endif /* XENT_IO_H */
