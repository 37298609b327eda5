/* tests/test_io.c: .safetensors / .npy round trips, naming, and the corpus
 * of broken files in tests/data/broken/ (see tests/data/make_broken.py):
 * every one must fail with the listed status and a message naming the
 * problem, leave the output untouched, and never read out of bounds (the
 * ASan build of this file proves the last part). */
#include "harness.h"
#include "io/io_internal.h"
#include "xent.h"

#include <dirent.h>
#include <stdlib.h>
#include <unistd.h>

/* ---- helpers ----------------------------------------------------------- */

/* A fresh temporary directory; *dir receives its path. */
static int tmpdir(char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/xent_io_XXXXXX");
    return mkdtemp(dir) != NULL;
}

/* Removes every file in dir, then dir. */
static void rmdir_all(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* A tensor with a random shape (ndim 0..4, dims 0..6) and random bytes. */
static xent_tensor rand_tensor(const char *name, xent_dtype dt, int ndim) {
    xt_rng_t *r = xt_rng();
    xent_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.dtype = dt;
    t.ndim = ndim;
    for (int d = 0; d < ndim; d++) t.shape[d] = 1 + xt_randint(r, 6);
    t.nbytes = (size_t)xent_tensor_numel(&t) * xent_dtype_size(dt);
    t.data = malloc(t.nbytes ? t.nbytes : 1);
    unsigned char *b = t.data;
    for (size_t i = 0; i < t.nbytes; i++) b[i] = (unsigned char)xt_next(r);
    return t;
}

static int same_meta(const xent_tensor *a, const xent_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->nbytes != b->nbytes) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

/* ---- round trips ------------------------------------------------------- */

TEST(io_safetensors_roundtrip_all_dtypes) {
    char dir[64], path[1024];
    CHECK(tmpdir(dir, sizeof dir), "mkdtemp failed");
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    enum { N = XENT_DTYPE_COUNT + 2 };
    xent_tensor ts[N];
    char name[32];
    for (int i = 0; i < XENT_DTYPE_COUNT; i++) {
        snprintf(name, sizeof name, "w.%s \"q\"", xent_dtype_name((xent_dtype)i));
        ts[i] = rand_tensor(name, (xent_dtype)i, 1 + i % 4);
    }
    ts[N - 2] = rand_tensor("scalar", XENT_F32, 0);
    ts[N - 1] = rand_tensor("empty", XENT_I64, 2);
    ts[N - 1].shape[1] = 0;
    ts[N - 1].nbytes = 0;
    CHECK(xent_tensors_save(path, ts, N) == XENT_OK, "save: %s", xent_last_error());
    /* header length is a multiple of 8 so the data block is aligned */
    FILE *f = fopen(path, "rb");
    unsigned char len[8] = {0};
    CHECK(f && fread(len, 1, 8, f) == 8, "reread");
    if (f) fclose(f);
    CHECK(len[0] % 8 == 0, "header length %u not a multiple of 8", len[0]);
    for (int i = 0; i < N; i++) {
        char spec[8192];
        xent_tensor t;
        snprintf(spec, sizeof spec, "%s:%s", path, ts[i].name);
        xent_status st = xent_tensor_load(spec, &t);
        CHECK(st == XENT_OK, "load %s: %s", spec, xent_last_error());
        if (st) continue;
        CHECK(same_meta(&t, &ts[i]) && !strcmp(t.name, ts[i].name), "metadata of '%s'", ts[i].name);
        CHECK(t.nbytes == 0 || !memcmp(t.data, ts[i].data, t.nbytes), "data of '%s' differs", ts[i].name);
        xent_tensor_free(&t);
        CHECK(t.data == NULL && t.ndim == 0, "free zeroes the tensor");
    }
    xent_tensor *list = NULL;
    int n = -1;
    CHECK(xent_safetensors_list(path, &list, &n) == XENT_OK, "list: %s", xent_last_error());
    CHECK(n == N, "listed %d tensors, want %d", n, N);
    for (int i = 0; i < n && i < N; i++)
        CHECK(!strcmp(list[i].name, ts[i].name) && same_meta(&list[i], &ts[i]) && !list[i].data,
              "list[%d] = '%s'", i, list[i].name);
    free(list);
    for (int i = 0; i < N; i++) xent_tensor_free(&ts[i]);
    rmdir_all(dir);
}

TEST(io_npy_roundtrip_all_dtypes) {
    char dir[64], path[1024];
    CHECK(tmpdir(dir, sizeof dir), "mkdtemp failed");
    for (int i = 0; i < XENT_DTYPE_COUNT; i++) {
        xent_dtype dt = (xent_dtype)i;
        for (int ndim = 0; ndim <= 3; ndim++) {
            snprintf(path, sizeof path, "%s/a_%d_%d.npy", dir, i, ndim);
            xent_tensor t = rand_tensor("", dt, ndim), u;
            CHECK(xent_tensors_save(path, &t, 1) == XENT_OK, "save: %s", xent_last_error());
            xent_status st = xent_tensor_load(path, &u);
            CHECK(st == XENT_OK, "load %s: %s", path, xent_last_error());
            if (st) { xent_tensor_free(&t); continue; }
            if (dt == XENT_BF16) {
                /* numpy has no bfloat16: widened to float32, exactly */
                CHECK(u.dtype == XENT_F32 && u.nbytes == t.nbytes * 2, "bf16 comes back as f32");
                int64_t n = xent_tensor_numel(&t);
                for (int64_t k = 0; k < n && u.dtype == XENT_F32; k++) {
                    float a = xent_bf16_to_f32(((uint16_t *)t.data)[k]), b = ((float *)u.data)[k];
                    CHECK(!memcmp(&a, &b, 4), "bf16[%lld] widened wrongly", (long long)k);
                    CHECK_LIMIT(5);
                }
            } else {
                CHECK(same_meta(&t, &u), "%s ndim %d: metadata", xent_dtype_name(dt), ndim);
                CHECK(t.nbytes == 0 || !memcmp(t.data, u.data, t.nbytes), "%s: data differs",
                      xent_dtype_name(dt));
            }
            /* the data starts on a 64-byte boundary */
            FILE *f = fopen(path, "rb");
            unsigned char pre[10] = {0};
            CHECK(f && fread(pre, 1, 10, f) == 10, "reread");
            if (f) fclose(f);
            CHECK((10 + pre[8] + 256 * pre[9]) % 64 == 0, "npy data offset not 64-aligned");
            xent_tensor_free(&t);
            xent_tensor_free(&u);
        }
    }
    rmdir_all(dir);
}

TEST(io_npy_multi_tensor_naming) {
    char dir[64], path[1024], spec[4096];
    CHECK(tmpdir(dir, sizeof dir), "mkdtemp failed");
    snprintf(path, sizeof path, "%s/out.npy", dir);
    xent_tensor ts[3] = {rand_tensor("nll", XENT_F32, 1), rand_tensor("grad", XENT_F16, 2),
                         rand_tensor("loss", XENT_F32, 0)};
    CHECK(xent_tensors_save(path, ts, 3) == XENT_OK, "save: %s", xent_last_error());
    for (int i = 0; i < 3; i++) {
        xent_tensor u;
        snprintf(spec, sizeof spec, "%s/out.%s.npy", dir, ts[i].name);
        CHECK(access(spec, R_OK) == 0, "%s was not written", spec);
        snprintf(spec, sizeof spec, "%s:%s", path, ts[i].name);
        xent_status st = xent_tensor_load(spec, &u);
        CHECK(st == XENT_OK, "load %s: %s", spec, xent_last_error());
        if (st) continue;
        CHECK(!strcmp(u.name, ts[i].name), "name '%s'", u.name);
        CHECK(same_meta(&u, &ts[i]) && (!u.nbytes || !memcmp(u.data, ts[i].data, u.nbytes)),
              "'%s' differs", ts[i].name);
        xent_tensor_free(&u);
    }
    for (int i = 0; i < 3; i++) xent_tensor_free(&ts[i]);
    rmdir_all(dir);
}

TEST(io_load_errors_name_the_problem) {
    char dir[64], path[1024], spec[4096];
    CHECK(tmpdir(dir, sizeof dir), "mkdtemp failed");
    snprintf(path, sizeof path, "%s/two.safetensors", dir);
    xent_tensor ts[2] = {rand_tensor("alpha", XENT_F32, 1), rand_tensor("beta", XENT_I32, 1)};
    CHECK(xent_tensors_save(path, ts, 2) == XENT_OK, "save: %s", xent_last_error());
    xent_tensor u, poison;
    memset(&poison, 0x5A, sizeof poison);
    u = poison;
    CHECK(xent_tensor_load(path, &u) == XENT_ERR_NOT_FOUND, "no name, two tensors");
    CHECK(strstr(xent_last_error(), "'alpha'") && strstr(xent_last_error(), "'beta'"), "msg: %s",
          xent_last_error());
    snprintf(spec, sizeof spec, "%s:gamma", path);
    CHECK(xent_tensor_load(spec, &u) == XENT_ERR_NOT_FOUND, "missing name");
    CHECK(strstr(xent_last_error(), "'gamma'") != NULL, "msg: %s", xent_last_error());
    CHECK(!memcmp(&u, &poison, sizeof u), "output touched on failure");
    snprintf(spec, sizeof spec, "%s/nope.safetensors", dir);
    CHECK(xent_tensor_load(spec, &u) == XENT_ERR_IO, "missing file");
    CHECK(strstr(xent_last_error(), "nope.safetensors") != NULL, "msg: %s", xent_last_error());
    snprintf(spec, sizeof spec, "%s/nope.safetensors:x", dir);
    CHECK(xent_tensor_load(spec, &u) == XENT_ERR_IO, "missing file with a name");
    CHECK(xent_tensor_load(dir, &u) == XENT_ERR_IO, "a directory");
    CHECK(xent_tensor_load(NULL, &u) == XENT_ERR_NULL, "NULL spec");
    CHECK(!memcmp(&u, &poison, sizeof u), "output touched on failure");
    /* save errors */
    snprintf(spec, sizeof spec, "%s/x.txt", dir);
    CHECK(xent_tensors_save(spec, ts, 2) == XENT_ERR_VALUE, "bad extension");
    xent_tensor dup[2] = {ts[0], ts[0]};
    CHECK(xent_tensors_save(path, dup, 2) == XENT_ERR_VALUE, "duplicate names");
    CHECK(strstr(xent_last_error(), "duplicate") != NULL, "msg: %s", xent_last_error());
    xent_tensor bad = ts[0];
    bad.nbytes += 1;
    CHECK(xent_tensors_save(path, &bad, 1) == XENT_ERR_SHAPE, "nbytes mismatch");
    bad = ts[0];
    bad.shape[0] = -3;
    CHECK(xent_tensors_save(path, &bad, 1) == XENT_ERR_SHAPE, "negative dim");
    for (int i = 0; i < 2; i++) xent_tensor_free(&ts[i]);
    rmdir_all(dir);
}

/* ---- the broken corpus ------------------------------------------------- */

static const char *corpus_dir(void) {
    static char buf[1024];
    if (access("tests/data/broken/MANIFEST", R_OK) == 0) return "tests/data/broken";
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 64);
    if (n <= 0) return NULL;
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (!slash) return NULL;
    strcpy(slash, "/../tests/data/broken");
    return access(buf, R_OK) == 0 ? buf : NULL;
}

static int status_by_name(const char *s, xent_status *out) {
    static const struct { const char *n; xent_status st; } tab[] = {
        {"FORMAT", XENT_ERR_FORMAT}, {"DTYPE", XENT_ERR_DTYPE}, {"NOT_FOUND", XENT_ERR_NOT_FOUND},
        {"IO", XENT_ERR_IO},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(s, tab[i].n)) { *out = tab[i].st; return 1; }
    return 0;
}

/* Loads one corpus file three ways (by path, from memory, listing). */
static void check_broken(const char *dir, const char *name, xent_status want, const char *text) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    xent_tensor u, poison;
    memset(&poison, 0x5A, sizeof poison);
    u = poison;
    xent_status st = xent_tensor_load(path, &u);
    CHECK(st == want, "%s: status %s, want %s (%s)", name, xent_strerror(st), xent_strerror(want),
          xent_last_error());
    CHECK(strstr(xent_last_error(), text) != NULL, "%s: message '%s' lacks '%s'", name, xent_last_error(),
          text);
    CHECK(!memcmp(&u, &poison, sizeof u), "%s: output touched on failure", name);
    if (st == XENT_OK) xent_tensor_free(&u);
    /* the same bytes from an exact-size heap buffer: ASan sees any overread */
    FILE *f = fopen(path, "rb");
    if (!f) { CHECK(0, "cannot open %s", path); return; }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *mem = malloc(size > 0 ? (size_t)size : 1);
    CHECK(mem && fread(mem, 1, (size_t)size, f) == (size_t)size, "read %s", path);
    fclose(f);
    xent__src src = {NULL, mem, (uint64_t)size, name};
    int npy = strstr(name, ".npy") != NULL;
    st = npy ? xent__npy_load(&src, &u) : xent__st_load(&src, NULL, &u);
    CHECK(st == want, "%s (memory): status %s, want %s", name, xent_strerror(st), xent_strerror(want));
    if (st == XENT_OK) xent_tensor_free(&u);
    if (!npy) {
        xent_tensor *list = NULL;
        int n = 0;
        if (xent__st_list(&src, &list, &n) == XENT_OK) free(list);
    }
    free(mem);
}

TEST(io_broken_corpus) {
    const char *dir = corpus_dir();
    CHECK(dir != NULL, "tests/data/broken/MANIFEST not found (run from the repository root)");
    if (!dir) return;
    char path[1200], line[512];
    snprintf(path, sizeof path, "%s/MANIFEST", dir);
    FILE *m = fopen(path, "r");
    CHECK(m != NULL, "cannot open %s", path);
    if (!m) return;
    char names[128][96];
    int n = 0;
    while (fgets(line, sizeof line, m)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        line[strcspn(line, "\n")] = '\0';
        char *a = strtok(line, "|"), *b = strtok(NULL, "|"), *c = strtok(NULL, "");
        xent_status want;
        CHECK(a && b && c && status_by_name(b, &want), "bad MANIFEST line '%s'", line);
        if (!(a && b && c) || !status_by_name(b, &want)) continue;
        check_broken(dir, a, want, c);
        if (n < 128) snprintf(names[n++], sizeof names[0], "%s", a);
    }
    fclose(m);
    CHECK(n >= 60, "only %d corpus entries", n);
    /* every file in the directory is listed */
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "MANIFEST")) continue;
        int found = 0;
        for (int i = 0; i < n && !found; i++) found = !strcmp(names[i], e->d_name);
        CHECK(found, "%s is not in MANIFEST", e->d_name);
    }
    if (d) closedir(d);
}

/* ---- mutations of valid files, from memory ----------------------------- */

/* Builds a valid file image of each format in memory. */
static unsigned char *file_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)size);
    if (b && fread(b, 1, (size_t)size, f) != (size_t)size) { free(b); b = NULL; }
    fclose(f);
    *n = (size_t)size;
    return b;
}

/* Random byte flips, truncations and digit edits of valid files: every
 * result either loads a consistent tensor or fails with a message. */
TEST(io_mutations_never_crash) {
    char dir[64], sp[1024], np[1024];
    CHECK(tmpdir(dir, sizeof dir), "mkdtemp failed");
    snprintf(sp, sizeof sp, "%s/m.safetensors", dir);
    snprintf(np, sizeof np, "%s/m.npy", dir);
    xent_tensor ts[2] = {rand_tensor("a", XENT_F32, 2), rand_tensor("b", XENT_I64, 1)};
    CHECK(xent_tensors_save(sp, ts, 2) == XENT_OK && xent_tensors_save(np, ts, 1) == XENT_OK, "save");
    size_t sn = 0, nn = 0;
    unsigned char *sb = file_bytes(sp, &sn), *nb = file_bytes(np, &nn);
    CHECK(sb && nb, "reread");
    xt_rng_t *r = xt_rng();
    int iters = xt_sanitizer() ? 1500 : 4000, ok = 0;
    for (int it = 0; it < iters && sb && nb; it++) {
        int npy = it & 1;
        size_t n = npy ? nn : sn;
        unsigned char *m = malloc(n);
        memcpy(m, npy ? nb : sb, n);
        int edits = 1 + (int)xt_randint(r, 3);
        for (int k = 0; k < edits; k++) {
            size_t at = (size_t)xt_randint(r, (int64_t)(n < 140 ? n : 140));
            switch (xt_randint(r, 4)) {
            case 0: m[at] = (unsigned char)xt_next(r); break;
            case 1: m[at] = (unsigned char)('0' + xt_randint(r, 10)); break;
            case 2: m[at] ^= (unsigned char)(1u << xt_randint(r, 8)); break;
            default: n = at; break; /* truncate */
            }
        }
        xent__src src = {NULL, m, n, "mutant"};
        xent_tensor u;
        xent_status st = npy ? xent__npy_load(&src, &u) : xent__st_load(&src, "a", &u);
        if (st == XENT_OK) {
            ok++;
            CHECK((int64_t)u.nbytes == xent_tensor_numel(&u) * (int64_t)xent_dtype_size(u.dtype),
                  "inconsistent tensor from a mutant");
            CHECK(u.nbytes <= n, "tensor larger than the file");
            xent_tensor_free(&u);
        } else {
            CHECK(xent_last_error()[0] != '\0', "failure without a message");
        }
        free(m);
        CHECK_LIMIT(5);
    }
    CHECK(ok > 0 && ok < iters, "mutants: %d of %d loaded (expect some of each)", ok, iters);
    free(sb);
    free(nb);
    for (int i = 0; i < 2; i++) xent_tensor_free(&ts[i]);
    rmdir_all(dir);
}

/* ---- the JSON parser and the .npy dict grammar, directly ---------------- */

TEST(io_json_strict_grammar) {
    static const char *valid[] = {
        "{}", " [ ] ", "0", "-0", "1.5e-3", "-12.25E+2", "\"\"", "true", "false", "null",
        "{\"a\":[1,2,{\"b\":null}],\"c\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"}",
        "\"\\u00e9\\u20ac\\ud83d\\ude00\"", "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"",
        "\t\r\n{\"x\" : 1 }\n   ",
    };
    static const char *invalid[] = {
        "", " ", "{", "}", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "01", "1.", ".5", "1e", "-",
        "+1", "'a'", "\"abc", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"", "\"\xc0\xaf\"",
        "\"\xed\xa0\x80\"", "\"\xf5\x80\x80\x80\"", "tru", "nul", "[1 2]", "{} {}", "NaN", "Infinity",
        "\"a\x01\"",
    };
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++) {
        xent_json j;
        xent_status st = xent_json_parse(valid[i], strlen(valid[i]), "t", &j);
        CHECK(st == XENT_OK, "valid JSON '%s' refused: %s", valid[i], xent_last_error());
        if (st == XENT_OK) xent_json_free(&j);
    }
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        xent_json j;
        xent_status st = xent_json_parse(invalid[i], strlen(invalid[i]), "t", &j);
        CHECK(st == XENT_ERR_FORMAT, "invalid JSON '%s' accepted", invalid[i]);
        if (st == XENT_OK) xent_json_free(&j);
    }
    /* decoded strings and lookups */
    const char *s = "{\"k\\u00e9y\":\"v\\n\",\"n\":[7, 18446744073709551615, 9223372036854775807]}";
    xent_json j;
    CHECK(xent_json_parse(s, strlen(s), "t", &j) == XENT_OK, "parse: %s", xent_last_error());
    const xent_json_node *v = xent_json_get(&j, &j.nodes[0], "k\xc3\xa9y");
    CHECK(v && v->type == XENT_JSON_STR && v->len == 2 && !memcmp(v->str, "v\n", 2), "decoded value");
    const xent_json_node *n = xent_json_get(&j, &j.nodes[0], "n");
    int64_t x = 0;
    CHECK(n && n->count == 3, "array count");
    if (n && n->count == 3) {
        const xent_json_node *a = &j.nodes[n->first], *b = &j.nodes[a->next], *c = &j.nodes[b->next];
        CHECK(xent_json_uint(a, &x) && x == 7, "7");
        CHECK(!xent_json_uint(b, &x), "2^64-1 is not an int64");
        CHECK(xent_json_uint(c, &x) && x == INT64_MAX, "2^63-1");
    }
    xent_json_free(&j);
    /* nesting: 64 levels parse, 65 do not */
    char deep[200];
    for (int depth = 64; depth <= 65; depth++) {
        memset(deep, '[', (size_t)depth);
        memset(deep + depth, ']', (size_t)depth);
        xent_status st = xent_json_parse(deep, (size_t)(2 * depth), "t", &j);
        CHECK((st == XENT_OK) == (depth <= XENT__JSON_MAX_DEPTH), "depth %d: %s", depth, xent_last_error());
        if (st == XENT_OK) xent_json_free(&j);
    }
}

/* Header spellings numpy has written over the years all load. */
TEST(io_npy_header_variants) {
    static const char *hdrs[] = {
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }",
        "{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(2,2)}",
        "{'shape': (2L, 2L), 'fortran_order': False, 'descr': '<f4'}",
        "{'descr': '=f4', 'fortran_order': False, 'shape': (4,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 4,), }",
    };
    static const int64_t numel = 4;
    for (size_t i = 0; i < sizeof hdrs / sizeof hdrs[0]; i++) {
        for (int major = 1; major <= 3; major++) {
            unsigned char buf[256];
            size_t hl = strlen(hdrs[i]) + 1, pre = major == 1 ? 10 : 12;
            memcpy(buf, "\x93NUMPY", 6);
            buf[6] = (unsigned char)major;
            buf[7] = 0;
            buf[8] = (unsigned char)hl;
            buf[9] = buf[10] = buf[11] = 0;
            memcpy(buf + pre, hdrs[i], hl - 1);
            buf[pre + hl - 1] = '\n';
            float data[4] = {1, 2, 3, 4};
            memcpy(buf + pre + hl, data, sizeof data);
            xent__src src = {NULL, buf, pre + hl + sizeof data, "variant"};
            xent_tensor t;
            xent_status st = xent__npy_load(&src, &t);
            CHECK(st == XENT_OK, "header %zu v%d: %s", i, major, xent_last_error());
            if (st) continue;
            CHECK(t.dtype == XENT_F32 && xent_tensor_numel(&t) == numel && !memcmp(t.data, data, sizeof data),
                  "header %zu v%d: contents", i, major);
            xent_tensor_free(&t);
        }
    }
}
