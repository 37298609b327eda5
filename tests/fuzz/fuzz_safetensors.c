/* tests/fuzz/fuzz_safetensors.c: libFuzzer target for the .safetensors
 * reader (header length, JSON, entries, offsets, data). Built by `make fuzz`
 * (mk/fuzz.mk); seeds: tests/data/broken/ and tests/fuzz/seeds/. */
#include "io/io_internal.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    xent__src src = {NULL, data, (uint64_t)size, "fuzz"};
    xent_tensor t;
    /* the only tensor, then a named one, then the listing */
    if (xent__st_load(&src, NULL, &t) == XENT_OK) {
        if (t.nbytes != (size_t)xent_tensor_numel(&t) * xent_dtype_size(t.dtype) || t.nbytes > size) abort();
        xent_tensor_free(&t);
    }
    if (xent__st_load(&src, "a", &t) == XENT_OK) xent_tensor_free(&t);
    xent_tensor *list = NULL;
    int n = 0;
    if (xent__st_list(&src, &list, &n) == XENT_OK) {
        for (int i = 0; i < n; i++)
            if (list[i].nbytes > size || !memchr(list[i].name, '\0', XENT_MAX_NAME)) abort();
        free(list);
    }
    return 0;
}
