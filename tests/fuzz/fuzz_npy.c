/* tests/fuzz/fuzz_npy.c: libFuzzer target for the .npy reader (preamble,
 * header dict, shape, data). Built by `make fuzz` (mk/fuzz.mk); seeds:
 * tests/data/broken/ and tests/fuzz/seeds/. */
#include "io/io_internal.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    xent__src src = {NULL, data, (uint64_t)size, "fuzz"};
    xent_tensor t;
    if (xent__npy_load(&src, &t) == XENT_OK) {
        if (t.nbytes != (size_t)xent_tensor_numel(&t) * xent_dtype_size(t.dtype) || t.nbytes > size) abort();
        xent_tensor_free(&t);
    }
    return 0;
}
