/* src/model/gguf.h: a GGUF (v2/v3) reader over a memory image. Every count,
 * offset and size is checked with overflow-safe arithmetic against the
 * image's size before use; a hostile file gives XENT_ERR_FORMAT naming the
 * field or tensor, never an out-of-bounds read. */
#ifndef XENT_MODEL_GGUF_H
#define XENT_MODEL_GGUF_H

#include "xent.h"

#include <stdint.h>

enum {
    XENT__GT_U8 = 0, XENT__GT_I8, XENT__GT_U16, XENT__GT_I16, XENT__GT_U32,
    XENT__GT_I32, XENT__GT_F32, XENT__GT_BOOL, XENT__GT_STR, XENT__GT_ARR,
    XENT__GT_U64, XENT__GT_I64, XENT__GT_F64, XENT__GT_COUNT
};

/* ggml tensor types read here */
enum {
    XENT__GG_F32 = 0, XENT__GG_F16 = 1, XENT__GG_Q4_0 = 2, XENT__GG_Q4_1 = 3,
    XENT__GG_Q8_0 = 8, XENT__GG_BF16 = 30
};

typedef struct xent__gguf_kv {
    const char *key;  /* not NUL-terminated: klen bytes                    */
    uint64_t klen;
    uint32_t type;    /* XENT__GT_*                                        */
    uint32_t atype;   /* array element type                                */
    uint64_t n;       /* array length (1 for scalars)                      */
    uint64_t off;     /* offset of the value (array: of the first element) */
} xent__gguf_kv;

typedef struct xent__gguf_tensor {
    char name[96];
    uint32_t ndim;
    int64_t ne[4];    /* ne[0] innermost (columns)                         */
    uint32_t type;
    int64_t numel;
    uint64_t off;     /* absolute offset of the data in the image          */
    uint64_t nbytes;
} xent__gguf_tensor;

typedef struct xent__gguf {
    const uint8_t *p; /* [size] the image                                  */
    uint64_t size;
    uint32_t version;
    int64_t n_kv, n_tensors;
    xent__gguf_kv *kv;          /* [n_kv]                                  */
    xent__gguf_tensor *tensors; /* [n_tensors]                             */
    uint64_t alignment, data_off;
} xent__gguf;

xent_status xent__gguf_parse(const uint8_t *p, uint64_t size, xent__gguf *g);
void xent__gguf_free(xent__gguf *g);

const xent__gguf_kv *xent__gguf_find(const xent__gguf *g, const char *key);
/* Integer / float scalar (any numeric type) -> *out; 0 if absent or not a
 * number. */
int xent__gguf_int(const xent__gguf *g, const char *key, int64_t *out);
int xent__gguf_f64(const xent__gguf *g, const char *key, double *out);
/* String value (not NUL-terminated) -> pointer + length; 0 if absent. */
int xent__gguf_str(const xent__gguf *g, const char *key, const char **s,
                   uint64_t *len);
/* Element i of a string array (bounds were checked by the parser's walk,
 * but this re-walks safely). */
const xent__gguf_tensor *xent__gguf_tensor_find(const xent__gguf *g,
                                                const char *name);
/* Dequantizes n elements (n a multiple of 32 for block types) of ggml type
 * `type` from src to dst. */
xent_status xent__gguf_dequant(uint32_t type, const uint8_t *src, int64_t n,
                               float *dst);
/* Bytes of n elements of type (0 for an unknown type or a bad n). */
uint64_t xent__gguf_nbytes(uint32_t type, int64_t n);


/* The model from a GGUF image in memory (the loader maps the file and calls
 * this; tests and the fuzz target call it on buffers). */
#include "model/model.h"
xent_status xent__model_from_gguf(const uint8_t *p, uint64_t size,
                                  const char *path, xent_model **out);

#endif
