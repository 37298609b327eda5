/* tests/test_families.c: the architecture families (llama, qwen2, qwen3,
 * mistral, gemma2, gemma3_text) against the float64 numpy reference of
 * tests/families/make_families.py, on the sharded checkpoints it writes.
 * Run by tests/stages/model_families.sh, which sets XENT_FAMILIES_DIR
 * (skipped without it).
 *
 * Tolerances (normwise: max |C - ref| over max |ref|):
 *   f64 path (xent_model_run_f64) vs numpy: loss 1e-12 relative. Both
 *     compute in float64 from the same float32 weights and RoPE tables (HF's
 *     float32 inverse frequencies and angles; cos/sin rounded to float32 by
 *     each side), so only summation order differs (measured <= 4e-16).
 *   fp32 path (xent_model_run, policy fp32) vs numpy: loss 1e-6 relative,
 *     logits 5e-6 normwise: float32 storage of every activation through 3-4
 *     layers, about 1e-7 per op grown by the norms and soft-caps (measured:
 *     loss <= 8e-8, logits <= 7e-7).
 *   gradients vs central finite differences of the numpy loss (h = 1e-5 max
 *     (1, |w|): truncation and rounding ~1e-9 of the gradient scale):
 *     f64 path |g - fd| <= 1e-6 (|fd| + 1e-3 gmax); fp32 path
 *     |g - fd| <= 1e-4 (|fd| + 1e-2 gmax), gmax the family's largest |fd|
 *     (measured worst error / tolerance: f64 0.34, fp32 0.1).
 */
#include "harness.h"
#include "model/model.h"
#include "xent/io.h"

#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, size_t *len) {
    uint64_t size = 0;
    FILE *f = xent_file_open(path, &size);
    if (!f) return NULL;
    char *p = malloc((size_t)size + 1);
    if (p && fread(p, 1, (size_t)size, f) != (size_t)size) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) p[size] = 0, *len = (size_t)size;
    return p;
}

static double num(const xent_json_node *n) { return n ? strtod(n->str, NULL) : NAN; }

/* Array of numbers -> malloc'ed doubles. */
static double *nums(const xent_json *j, const xent_json_node *a, int64_t *n) {
    *n = a && a->type == XENT_JSON_ARR ? a->count : 0;
    double *v = malloc((size_t)(*n ? *n : 1) * sizeof *v);
    int64_t k = 0;
    for (int64_t c = *n ? a->first : -1; v && c >= 0; c = j->nodes[c].next)
        v[k++] = strtod(j->nodes[c].str, NULL);
    return v;
}

static void one_family(const char *dir, const char *fam) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/ref.json", dir, fam);
    size_t len = 0;
    char *text = slurp(path, &len);
    CHECK(text, "%s: cannot read %s", fam, path);
    if (!text) return;
    xent_json j;
    CHECK(xent_json_parse(text, len, path, &j) == XENT_OK, "%s", xent_last_error());
    const xent_json_node *r = &j.nodes[0];
    snprintf(path, sizeof path, "%s/%s", dir, fam);
    xent_model *m = NULL;
    xent_status st = xent_model_load_hf(path, &m);
    CHECK(st == XENT_OK, "%s: load: %s", fam, xent_last_error());
    if (st) goto out;
    CHECK(!strcmp(m->cfg.arch, fam), "%s: arch %s", fam, m->cfg.arch);
    /* the tokenizer: the ids of the text (byte-level or SentencePiece-style) */
    {
        const xent_json_node *ids = xent_json_get(&j, r, "text_ids");
        const xent_json_node *tx = xent_json_get(&j, r, "text");
        CHECK(ids && ids->type == XENT_JSON_ARR && tx, "%s: ref.json has no text_ids", fam);
        if (ids && ids->type == XENT_JSON_ARR && tx) {
            CHECK(m->tok, "%s: no tokenizer: %s", fam, m->tok_note);
            int32_t *got = NULL;
            int64_t n = 0;
            if (m->tok && xent_tokenize(m->tok, tx->str, tx->len, &got, &n) == XENT_OK) {
                int64_t ne = 0;
                double *want = nums(&j, ids, &ne);
                int same = n == ne;
                for (int64_t i = 0; same && i < n; i++) same = got[i] == (int32_t)want[i];
                CHECK(same, "%s: tokenizer.json (%s): %lld ids, expected %lld", fam,
                      xent_tokenizer_pre(m->tok), (long long)n, (long long)ne);
                char *back = NULL;
                size_t bl = 0;
                CHECK(xent_detokenize(m->tok, got, n, &back, &bl) == XENT_OK && bl == tx->len &&
                          !memcmp(back, tx->str, bl), "%s: decode does not give the text back", fam);
                free(back), free(want);
            }
            free(got);
        }
    }
    int64_t B = (int64_t)num(xent_json_get(&j, r, "B")), S = (int64_t)num(xent_json_get(&j, r, "S"));
    int64_t nt = 0, nz = 0, T = B * S, V = m->cfg.vocab;
    double *tokd = nums(&j, xent_json_get(&j, r, "tokens"), &nt);
    double *zref = nums(&j, xent_json_get(&j, r, "logits"), &nz);
    double loss_ref = num(xent_json_get(&j, r, "loss"));
    CHECK(nt == T && nz == T * V, "%s: ref shapes", fam);
    int32_t *tok = malloc((size_t)T * sizeof *tok);
    for (int64_t i = 0; i < T; i++) tok[i] = (int32_t)tokd[i];
    xent_model_run_opts o;
    xent_model_run_opts_init(&o);
    o.B = B, o.S = S, o.tokens = tok, o.record = 1;
    /* f64 */
    double l64 = 0;
    double **g64 = calloc((size_t)m->n_params, sizeof *g64);
    for (int i = 0; i < m->n_params; i++) g64[i] = calloc((size_t)m->params[i].numel, sizeof(double));
    st = xent_model_run_f64(m, &o, &l64, g64, NULL);
    CHECK(st == XENT_OK, "%s: f64: %s", fam, xent_last_error());
    /* fp32 */
    xent_model_ws *ws = NULL;
    xent_model_record rec;
    CHECK(xent_model_ws_new(m, B, S, 1, &ws) == XENT_OK, "%s: ws", fam);
    xent_precision p = xent_precision_fp32();
    st = ws ? xent_model_run(m, ws, &p, &o, &rec) : XENT_ERR_ALLOC;
    CHECK(st == XENT_OK, "%s: fp32: %s", fam, xent_last_error());
    if (!st) {
        double zmax = 0, e32 = 0;
        for (int64_t i = 0; i < T * V; i++) {
            zmax = fmax(zmax, fabs(zref[i]));
            e32 = fmax(e32, fabs(rec.logits[i] - zref[i]));
        }
        double el64 = fabs(l64 - loss_ref) / fabs(loss_ref), el32 = fabs(rec.loss - loss_ref) / fabs(loss_ref);
        CHECK(el64 <= 1e-12, "%s: f64 loss %.17g vs %.17g (rel %.2e)", fam, l64, loss_ref, el64);
        CHECK(el32 <= 1e-6, "%s: fp32 loss %.9g vs %.17g (rel %.2e)", fam, rec.loss, loss_ref, el32);
        CHECK(e32 <= 5e-6 * zmax, "%s: fp32 logits off by %.3g (max |z| %.3g)", fam, e32, zmax);
        /* gradients against finite differences */
        const xent_json_node *gs = xent_json_get(&j, r, "grads");
        double gmax = 0, w64 = 0, w32 = 0;
        for (int64_t c = gs->first; c >= 0; c = j.nodes[c].next)
            gmax = fmax(gmax, fabs(num(xent_json_get(&j, &j.nodes[c], "value"))));
        int ng = 0;
        for (int64_t c = gs->first; c >= 0; c = j.nodes[c].next, ng++) {
            const xent_json_node *e = &j.nodes[c], *nm = xent_json_get(&j, e, "name");
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)nm->len, nm->str);
            int64_t idx = (int64_t)num(xent_json_get(&j, e, "index"));
            double fd = num(xent_json_get(&j, e, "value"));
            int pi = xent_model_param_find(m, name);
            CHECK(pi >= 0 && idx < m->params[pi].numel, "%s: parameter %s", fam, name);
            if (pi < 0) continue;
            double a = g64[pi][idx], b = rec.param_grads[pi][idx];
            double t64 = 1e-6 * (fabs(fd) + 1e-3 * gmax), t32 = 1e-4 * (fabs(fd) + 1e-2 * gmax);
            w64 = fmax(w64, fabs(a - fd) / t64), w32 = fmax(w32, fabs(b - fd) / t32);
            CHECK(fabs(a - fd) <= t64, "%s: f64 grad %s[%lld] = %.12g, finite difference %.12g", fam,
                  name, (long long)idx, a, fd);
            CHECK(fabs(b - fd) <= t32, "%s: fp32 grad %s[%lld] = %.9g, finite difference %.12g", fam,
                  name, (long long)idx, b, fd);
        }
        printf("  %-12s loss rel err f64 %.1e fp32 %.1e; fp32 logits %.1e of max; %d grads: "
               "worst/tol f64 %.2f fp32 %.2f\n", fam, el64, el32, e32 / zmax, ng, w64, w32);
    }
    xent_model_ws_free(ws);
    for (int i = 0; i < m->n_params; i++) free(g64[i]);
    free(g64), free(tok), free(tokd), free(zref);
out:
    xent_model_free(m);
    xent_json_free(&j);
    free(text);
}

TEST(model_families) {
    const char *dir = getenv("XENT_FAMILIES_DIR");
    if (!dir || !*dir) {
        xt_skip("XENT_FAMILIES_DIR not set (tests/stages/model_families.sh sets it)");
        return;
    }
    static const char *const fam[] = {"llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text"};
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) one_family(dir, fam[i]);
}
