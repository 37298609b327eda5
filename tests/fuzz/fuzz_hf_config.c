/* tests/fuzz/fuzz_hf_config.c: libFuzzer target for the Hugging Face
 * config.json reader (the strict JSON parser, then every value checked:
 * types, ranges, integrality, consistency). A configuration it accepts
 * must pass xent_model_config_check. Built by `make fuzz`. */
#include "model/model.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
xent_status xent__hf_config_parse(const char *text, size_t len, const char *path,
                                  xent_model_config *c);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    xent_model_config c;
    if (xent__hf_config_parse((const char *)data, size, "fuzz/config.json", &c) == XENT_OK &&
        xent_model_config_check(&c) != XENT_OK)
        abort();
    return 0;
}
