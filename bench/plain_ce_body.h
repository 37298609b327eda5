/* bench/plain_ce_body.h: the body of the plain fp32 anchor, included by
 * bench/plain_ce.h once per instruction set (PLAIN_FN names each copy). */
/* expf for x <= 0 (relative error ~2e-7): 2^k p(r), branch-free */
static inline __attribute__((always_inline)) float PLAIN_FN(expf)(float x) {
    x = x < -87.0f ? -87.0f : x;
    float k = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* nearest integer */
    float r = x - k * 0.693145752f;
    r = r - k * 1.42860677e-6f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t e = ((int32_t)k + 127) << 23;
    float s;
    memcpy(&s, &e, 4);
    return p * s;
}

static inline __attribute__((always_inline)) float PLAIN_FN(bf16_f32)(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline __attribute__((always_inline)) uint16_t PLAIN_FN(f32_bf16)(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* One bf16 row: returns its nll (lse - z_t), 0 for t < 0; grad (bf16, may
 * be NULL) = scale (softmax - onehot), zeros for t < 0. */
static float PLAIN_FN(row)(const uint16_t *z, int64_t V, int64_t t, float scale, uint16_t *grad) {
    float buf[PLAIN_BLOCK];
    float m = -INFINITY;
    for (int64_t j0 = 0; j0 < V; j0 += PLAIN_BLOCK) {
        int64_t n = V - j0 < PLAIN_BLOCK ? V - j0 : PLAIN_BLOCK;
        float mm[16];
        for (int k = 0; k < 16; k++) mm[k] = -INFINITY;
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
            for (int k = 0; k < 16; k++) {
                float v = PLAIN_FN(bf16_f32)(z[j0 + i + k]);
                mm[k] = v > mm[k] ? v : mm[k];
            }
        for (; i < n; i++) {
            float v = PLAIN_FN(bf16_f32)(z[j0 + i]);
            m = v > m ? v : m;
        }
        for (int k = 0; k < 16; k++) m = mm[k] > m ? mm[k] : m;
    }
    float s = 0;
    for (int64_t j0 = 0; j0 < V; j0 += PLAIN_BLOCK) {
        int64_t n = V - j0 < PLAIN_BLOCK ? V - j0 : PLAIN_BLOCK;
        for (int64_t i = 0; i < n; i++) buf[i] = PLAIN_FN(expf)(PLAIN_FN(bf16_f32)(z[j0 + i]) - m);
        float acc[16] = {0};
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
            for (int k = 0; k < 16; k++) acc[k] += buf[i + k];
        for (; i < n; i++) acc[0] += buf[i];
        for (int k = 0; k < 16; k++) s += acc[k];
    }
    float lse = m + logf(s);
    if (grad) {
        float sc = t >= 0 ? scale : 0.0f;
        for (int64_t j0 = 0; j0 < V; j0 += PLAIN_BLOCK) {
            int64_t n = V - j0 < PLAIN_BLOCK ? V - j0 : PLAIN_BLOCK;
            for (int64_t i = 0; i < n; i++)
                grad[j0 + i] = PLAIN_FN(f32_bf16)(sc * PLAIN_FN(expf)(PLAIN_FN(bf16_f32)(z[j0 + i]) - lse));
        }
        if (t >= 0) grad[t] = PLAIN_FN(f32_bf16)(scale * (PLAIN_FN(expf)(PLAIN_FN(bf16_f32)(z[t]) - lse) - 1.0f));
    }
    return t >= 0 ? lse - PLAIN_FN(bf16_f32)(z[t]) : 0.0f;
}

