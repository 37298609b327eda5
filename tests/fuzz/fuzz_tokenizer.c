/* tests/fuzz/fuzz_tokenizer.c: libFuzzer target for the byte-level BPE
 * tokenizer: a vocabulary (with token types), merges and a text, all from
 * the input, then encode and decode. Input layout (sections split by the
 * byte 0xFF): the first byte picks the pre-tokenizer; tokens separated by
 * 0xFE (a token starting with 0x01 is a special token); 0xFF; merges
 * separated by 0xFE; 0xFF; the text. The 256 byte symbols are always in the
 * vocabulary, so every text can be encoded. Built by `make fuzz`. */
#include "model/model_internal.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAXT 4096

static void byte_sym(int b, char *out) {
    int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    int cp = b;
    if (!keep) {
        int k = 0;
        for (int x = 0; x < b; x++) k += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
        cp = 256 + k;
    }
    if (cp < 128) out[0] = (char)cp, out[1] = 0;
    else out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 63)), out[2] = 0;
}

/* Splits [p, e) at byte sep into at most max pieces. */
static int split(const uint8_t *p, const uint8_t *e, uint8_t sep, char **s, size_t *l, int max) {
    int n = 0;
    while (p < e && n < max) {
        const uint8_t *q = memchr(p, sep, (size_t)(e - p));
        if (!q) q = e;
        s[n] = (char *)p;
        l[n++] = (size_t)(q - p);
        p = q + 1;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const char *pres[] = {"default", "smollm", "llama-bpe", "qwen2"};
    const char *pre = pres[data[0] & 3];
    const uint8_t *p = data + 1, *e = data + size;
    const uint8_t *s1 = memchr(p, 0xFF, (size_t)(e - p));
    const uint8_t *s2 = s1 ? memchr(s1 + 1, 0xFF, (size_t)(e - s1 - 1)) : NULL;
    const uint8_t *tok_end = s1 ? s1 : e, *mer_end = s2 ? s2 : e;
    static char syms[256][4];
    char **toks = malloc((256 + MAXT) * sizeof *toks), **mer = malloc(MAXT * sizeof *mer);
    size_t *tl = malloc((256 + MAXT) * sizeof *tl), *ml = malloc(MAXT * sizeof *ml);
    int32_t *ty = malloc((256 + MAXT) * sizeof *ty);
    for (int b = 0; b < 256; b++) {
        byte_sym(b, syms[b]);
        toks[b] = syms[b], tl[b] = strlen(syms[b]), ty[b] = 1;
    }
    int nt = split(p, tok_end, 0xFE, toks + 256, tl + 256, MAXT);
    for (int i = 0; i < nt; i++) {
        ty[256 + i] = 1;
        if (tl[256 + i] > 0 && toks[256 + i][0] == 1) {
            ty[256 + i] = 3;
            toks[256 + i]++, tl[256 + i]--;
        }
    }
    int nm = s1 ? split(s1 + 1, mer_end, 0xFE, mer, ml, MAXT) : 0;
    xent_tokenizer *t = NULL;
    if (xent__tokenizer_new(toks, tl, 256 + nt, mer, ml, nm, ty, pre, &t) == XENT_OK) {
        const char *text = s2 ? (const char *)s2 + 1 : "hello world 123";
        size_t len = s2 ? (size_t)(e - s2 - 1) : 15;
        int32_t *ids = NULL;
        int64_t n = 0;
        if (xent_tokenize(t, text, len, &ids, &n) == XENT_OK) {
            for (int64_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= 256 + nt) abort();
            char *back = NULL;
            size_t bl = 0;
            if (xent_detokenize(t, ids, n, &back, &bl) != XENT_OK) abort();
            free(back);
            free(ids);
        }
        xent_tokenizer_free(t);
    }
    free(toks), free(mer), free(tl), free(ml), free(ty);
    return 0;
}
