/* tests/test_core.c: dtype conversions and status strings. */
#include "harness.h"
#include "model/precision.h"
#include "xent.h"

#include <float.h>

/* nearest-even reference through exact double arithmetic */
static double round_ref(double d, int mant, int emin, double maxv) {
    if (d != d || d == 0 || isinf(d)) return d;
    int e;
    frexp(d, &e);
    int ex = e - 1 < emin ? emin : e - 1;
    double q = ldexp(1.0, ex - mant);
    double r = nearbyint(d / q) * q;
    return fabs(r) > maxv ? copysign(INFINITY, d) : r;
}

TEST(core_f16_bf16_conversions) {
    const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.98e-8f,
                             5.96e-8f, 6.1e-5f, 6.09e-5f, FLT_MIN, FLT_MAX, INFINITY, -INFINITY, 3.0e38f};
    int n = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < 200000 + n; i++) {
        float f;
        if (i < n) f = special[i];
        else {
            uint32_t u = (uint32_t)xt_next(xt_rng());
            memcpy(&f, &u, 4);
            if (isnan(f)) continue;
        }
        float h = xent_f16_to_f32(xent_f32_to_f16(f));
        double want = round_ref(f, 10, -14, 65504.0);
        CHECK(h == want || (h == 0 && want == 0 && signbit(h) == signbit(f)), "f16(%a) = %a, want %a", f, h, want);
        float b = xent_bf16_to_f32(xent_f32_to_bf16(f));
        double wb = round_ref(f, 7, -126, 0x1.FEp127);
        CHECK(b == wb || (b == 0 && wb == 0), "bf16(%a) = %a, want %a", f, b, wb);
        CHECK(xent_f32_to_f16(f) == xent_f64_to_f16((double)f), "f32 and f64 paths differ at %a", f);
        float rt = xent_round_to(f, XENT_F16);
        CHECK(rt == h || (isnan(rt) && isnan(h)), "xent_round_to(%a, f16) = %a, want %a", f, rt, h);
        CHECK_LIMIT(10);
    }
    CHECK(isnan(xent_f16_to_f32(xent_f32_to_f16(NAN))) && isnan(xent_bf16_to_f32(xent_f32_to_bf16(NAN))), "NaN lost");
}

TEST(core_dtype_names_and_status) {
    xent_dtype t;
    CHECK(xent_dtype_parse("bfloat16", &t) == XENT_OK && t == XENT_BF16, "bfloat16");
    CHECK(xent_dtype_parse("fp16", &t) == XENT_OK && t == XENT_F16, "fp16");
    CHECK(xent_dtype_parse("float8", &t) == XENT_ERR_VALUE && strstr(xent_last_error(), "float8"), "bad dtype: %s",
          xent_last_error());
    for (int s = 0; s < XENT_STATUS_COUNT; s++)
        CHECK(xent_strerror((xent_status)s) && strcmp(xent_strerror((xent_status)s), "unknown status"), "status %d", s);
    CHECK(xent_dtype_size(XENT_BF16) == 2 && xent_dtype_size(XENT_I64) == 8 && xent_dtype_size(XENT_DTYPE_COUNT) == 0,
          "sizes");
}

/* The CUDA kernel plan (every build has it): out-of-range fields are
 * refused naming the field and change nothing; the old plan comes back;
 * NULL restores the default. */
TEST(core_cuda_plan_checks) {
    xent_cuda_plan p, old, cur;
    xent_cuda_plan_init(&p);
    p.kernel = 2;
    p.onchip_blocks = 4;
    CHECK(xent_cuda_set_plan(&p, NULL) == XENT_OK, "a valid plan: %s", xent_last_error());
    const struct { const char *field; int which; long long v; } bad[] = {
        {"kernel", 0, 3},          {"kernel", 0, -1},         {"block", 1, 48},
        {"block", 1, 2048},        {"stage_bytes", 2, -2},    {"stage_bytes", 2, 204801},
        {"onchip_blocks", 3, 3},   {"onchip_threads", 4, 16}, {"onchip_threads", 4, 288},
        {"onchip_groups", 5, -1},  {"linear_rows", 6, -1},    {"linear_rows", 6, (1 << 20) + 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        xent_cuda_plan q;
        xent_cuda_plan_init(&q);
        switch (bad[i].which) {
        case 0: q.kernel = (int32_t)bad[i].v; break;
        case 1: q.block = (int32_t)bad[i].v; break;
        case 2: q.stage_bytes = (int32_t)bad[i].v; break;
        case 3: q.onchip_blocks = (int32_t)bad[i].v; break;
        case 4: q.onchip_threads = (int32_t)bad[i].v; break;
        case 5: q.onchip_groups = (int32_t)bad[i].v; break;
        default: q.linear_rows = bad[i].v; break;
        }
        xent_status s = xent_cuda_set_plan(&q, NULL);
        CHECK(s == XENT_ERR_VALUE && strstr(xent_last_error(), bad[i].field),
              "plan->%s = %lld: status %d, message '%s'", bad[i].field, bad[i].v, (int)s,
              xent_last_error());
    }
    CHECK(xent_cuda_set_plan(NULL, &old) == XENT_OK, "reset");
    CHECK(old.kernel == 2 && old.onchip_blocks == 4 && old.block == 0,
          "the plan set before the refused ones came back (kernel %d, blocks %d)", old.kernel,
          old.onchip_blocks);
    xent_cuda_set_plan(NULL, &cur);
    CHECK(cur.kernel == 0 && cur.onchip_blocks == 0, "NULL restores the default plan");
}
