/* tests/fuzz/fuzz_compare.c: libFuzzer target for the readers of
 * `xent compare`: plain text (one number per line), integers, JSON Lines
 * of per-sequence objects and the JSON token-id documents. The first byte
 * picks the reader; the rest is the file's content. Built by `make fuzz`. */
#include "compare/compare.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    /* the readers take a NUL-terminated buffer, as xent__cmp_slurp gives */
    size_t len = size - 1;
    char *buf = malloc(len + 1);
    if (!buf) return 0;
    memcpy(buf, data + 1, len);
    buf[len] = 0;
    switch (data[0] & 3) {
    case 0: {
        double *v = NULL;
        int64_t n = 0;
        if (xent__cmp_parse_text("fuzz.txt", buf, len, &v, &n) == XENT_OK) free(v);
        break;
    }
    case 1: {
        int64_t *v = NULL, n = 0;
        if (xent__cmp_parse_text_ints("fuzz.txt", buf, len, &v, &n) == XENT_OK) free(v);
        break;
    }
    default: {
        xent__cmp_series s;
        memset(&s, 0, sizeof s);
        if (xent__cmp_parse_json("fuzz.jsonl", buf, len, data[0] & 1, &s) == XENT_OK) {
            if (s.offsets)
                for (int64_t i = 0; i < s.nseq; i++)
                    if (s.offsets[i] > s.offsets[i + 1]) abort();
        }
        xent__cmp_series_free(&s);
    }
    }
    free(buf);
    return 0;
}
