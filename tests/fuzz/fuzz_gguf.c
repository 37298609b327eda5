/* tests/fuzz/fuzz_gguf.c: libFuzzer target for the GGUF parser and the
 * model loader on top of it (metadata, tensor infos, dequantization,
 * tokenizer tables). Built by `make fuzz-gguf` (mk/model.mk); seed:
 * tests/data/model/tiny.gguf. */
#include "model/gguf.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    xent_model *m = NULL;
    if (xent__model_from_gguf(data, (uint64_t)size, "fuzz", &m) == XENT_OK) {
        /* a model that loads must be usable: touch every weight */
        float acc = 0;
        for (int i = 0; i < m->n_params; i++)
            for (int64_t k = 0; k < m->params[i].numel; k++)
                acc += m->params[i].w[k];
        if (m->tok) {
            int32_t *ids = NULL;
            int64_t n = 0;
            if (xent_tokenize(m->tok, "hello 123 world", 15, &ids, &n) ==
                XENT_OK)
                free(ids);
        }
        (void)acc;
        xent_model_free(m);
    }
    return 0;
}
