/* tests/test_cli_flags.c: the CLI's flag parser (tools/flags.c), its
 * progress line (tools/progress.c) and its input/output helpers
 * (tools/input.c), called directly (libxent_cli.a). */
#include "harness.h"
#include "xent.h"

#include "../tools/flags.h"
#include "../tools/input.h"
#include "../tools/progress.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

/* ---- stderr capture ------------------------------------------------------ */

static char g_err[8192];
static int g_saved = -1;
static char g_err_path[64];

static void capture_begin(void) {
    fflush(stderr);
    snprintf(g_err_path, sizeof g_err_path, "/tmp/xent_flags_err_XXXXXX");
    int fd = mkstemp(g_err_path);
    g_saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
}

/* Ends the capture; the text is in g_err. */
static const char *capture_end(void) {
    fflush(stderr);
    dup2(g_saved, STDERR_FILENO);
    close(g_saved);
    FILE *f = fopen(g_err_path, "rb");
    size_t n = f ? fread(g_err, 1, sizeof g_err - 1, f) : 0;
    g_err[n] = '\0';
    if (f) fclose(f);
    unlink(g_err_path);
    return g_err;
}

/* ---- a command like `xent ce` ---------------------------------------------- */

typedef struct targs {
    const char *in, *out;
    int grad, red;
    int64_t threads, ignore;
    double smoothing, temperature;
    xent_dtype gdt;
    double list[4];
    int nlist;
    int allow;
} targs;

static const char *const k_red[] = {"none", "sum", "mean", NULL};
static const int k_red_v[] = {10, 11, 12};
static const char *const k_dt[] = {"f32", "bf16", NULL};

static int set_list(void *dst, const char *v, const char *flag, const char *cmd) {
    targs *a = dst;
    return xf_parse_f64_list(cmd, flag, v, a->list, 4, &a->nlist);
}

static xf_flag g_tf[16];
static const char *g_tpos[2];

static void tcmd(xf_cmd *c, targs *a, int npos) {
    memset(a, 0, sizeof *a);
    a->red = 12;
    a->ignore = -100;
    a->temperature = 1;
    a->gdt = XENT_F32;
    xf_flag t[] = {
        {"--in", XF_STRING, &a->in, "FILE", "input", NULL, XF_REQUIRED, 0, 0, NULL, NULL, NULL,
         NULL, 0},
        {"--out", XF_STRING, &a->out, "FILE", "output", NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0},
        {"--grad", XF_BOOL, &a->grad, NULL, "also the gradient", NULL, 0, 0, 0, NULL, NULL, NULL,
         NULL, 0},
        {"--reduction", XF_ENUM, &a->red, NULL, "reduction", NULL, 0, 0, 0, k_red, k_red_v, NULL,
         "reduction", 0},
        {"--threads", XF_INT, &a->threads, NULL, "threads", NULL, XF_MIN | XF_MAX, 0, 256, NULL,
         NULL, NULL, "threads", 0},
        {"--ignore-index", XF_INT, &a->ignore, NULL, "ignored label", NULL, 0, 0, 0, NULL, NULL,
         NULL, "ignore_index", 0},
        {"--label-smoothing", XF_FLOAT, &a->smoothing, NULL, "smoothing", NULL, XF_MIN | XF_MAX,
         0, 1, NULL, NULL, NULL, "label_smoothing", 0},
        {"--temperature", XF_FLOAT, &a->temperature, NULL, "divides the logits\nsecond line",
         NULL, XF_MIN | XF_LO_OPEN, 0, 0, NULL, NULL, NULL, "temperature", 0},
        {"--grad-dtype", XF_DTYPE, &a->gdt, NULL, "grad dtype", "the logits dtype", 0, 0, 0,
         k_dt, NULL, NULL, NULL, 0},
        {"--list", XF_FUNC, a, "LIST", "numbers", "none", 0, 0, 0, NULL, NULL, set_list, NULL, 0},
        {"--allow-nonfinite", XF_BOOL, &a->allow, NULL, "accept NaN", NULL, 0, 0, 0, NULL, NULL,
         NULL, NULL, 0},
    };
    memcpy(g_tf, t, sizeof t);
    *c = (xf_cmd){"tc", "xent tc --in FILE [options]", "About tc.\n\n", "Epilog.\n", g_tf,
                  (int)(sizeof t / sizeof t[0]), 0, npos ? "A B" : NULL, npos, npos, g_tpos, 0};
}

/* Parses the words of `line` (split on spaces); returns xf_parse's result
 * with stderr in g_err. */
static int parse_line(xf_cmd *c, const char *line) {
    static char buf[1024];
    char *argv[64];
    int argc = 0;
    snprintf(buf, sizeof buf, "tc %s", line);
    for (char *s = strtok(buf, " "); s && argc < 63; s = strtok(NULL, " ")) argv[argc++] = s;
    argv[argc] = NULL;
    capture_begin();
    int rc = xf_parse(c, argc, argv);
    capture_end();
    return rc;
}

TEST(cli_flags_forms) {
    xf_cmd c;
    targs a;
    tcmd(&c, &a, 0);
    CHECK(parse_line(&c, "--in x.npy --grad --reduction sum --threads=3 --ignore-index -1 "
                         "--label-smoothing=0.25 --temperature 0.5 --grad-dtype bf16 --list 1,2.5") == XF_RUN,
          "parse: %s", g_err);
    CHECK(a.in && !strcmp(a.in, "x.npy") && a.grad == 1 && a.red == 11 && a.threads == 3 &&
          a.ignore == -1 && a.smoothing == 0.25 && a.temperature == 0.5 && a.gdt == XENT_BF16 &&
          a.nlist == 2 && a.list[1] == 2.5, "values");
    CHECK(!a.out && xf_find(&c, "--out")->seen == 0 && xf_find(&c, "--grad")->seen == 1, "seen");
    tcmd(&c, &a, 0);
    CHECK(parse_line(&c, "--in a --threads 2 --threads 5") == XF_RUN && a.threads == 5,
          "the last repeated flag counts");
    CHECK(parse_line(&c, "--in=--odd") == XF_RUN && !strcmp(a.in, "--odd"), "--flag=--value");
    tcmd(&c, &a, 2);
    CHECK(parse_line(&c, "A.txt --in x -- --B") == XF_RUN && c.npos == 2 &&
          !strcmp(c.pos[0], "A.txt") && !strcmp(c.pos[1], "--B"), "positionals and --");
    CHECK(parse_line(&c, "--in x - -1") == XF_RUN && !strcmp(c.pos[0], "-") &&
          !strcmp(c.pos[1], "-1"), "'-' and a negative number are positional");
    CHECK(parse_line(&c, "--help") == XF_HELP, "--help");
    CHECK(parse_line(&c, "-h") == XF_HELP, "-h");
}

/* parse_line must return 2 and the message hold every needle. */
static void expect_usage(xf_cmd *c, const char *line, const char *n1, const char *n2) {
    int rc = parse_line(c, line);
    CHECK(rc == 2, "'%s': rc %d, want 2", line, rc);
    CHECK(strstr(g_err, n1) != NULL, "'%s': stderr lacks '%s': %s", line, n1, g_err);
    CHECK(!n2 || strstr(g_err, n2) != NULL, "'%s': stderr lacks '%s': %s", line, n2, g_err);
    CHECK(strncmp(g_err, "xent tc: ", 9) == 0, "'%s': message starts with the command: %s", line,
          g_err);
}

TEST(cli_flags_errors_name_the_flag) {
    xf_cmd c;
    targs a;
    tcmd(&c, &a, 0);
    expect_usage(&c, "--in x --label-smoothing 2", "--label-smoothing expects a number in [0, 1], got '2'", NULL);
    expect_usage(&c, "--in x --label-smoothing=nan", "--label-smoothing", "'nan'");
    expect_usage(&c, "--in x --temperature 0", "--temperature expects a number > 0, got '0'", NULL);
    expect_usage(&c, "--in x --threads 300", "--threads expects an integer in [0, 256], got '300'", NULL);
    expect_usage(&c, "--in x --threads 1.5", "--threads", "'1.5'");
    expect_usage(&c, "--in x --reduction avg", "--reduction got 'avg'; accepted: none, sum, mean", NULL);
    expect_usage(&c, "--in x --grad-dtype f16", "--grad-dtype got 'f16'; accepted: f32, bf16", NULL);
    expect_usage(&c, "--in x --bogus", "unknown flag '--bogus'", NULL);
    expect_usage(&c, "--in x --label-smothing 0.1", "unknown flag '--label-smothing'",
                 "did you mean --label-smoothing?");
    expect_usage(&c, "--in x --bogus=3", "unknown flag '--bogus'", NULL);
    expect_usage(&c, "--in", "--in needs a value", NULL);
    expect_usage(&c, "--in --grad", "--in needs a value, got the flag '--grad'", NULL);
    expect_usage(&c, "--in x --grad=1", "--grad takes no value", NULL);
    expect_usage(&c, "--grad", "--in is required", NULL);
    expect_usage(&c, "--in x extra", "unexpected argument 'extra'", NULL);
    expect_usage(&c, "--in x --list 1,x", "--list", "'x'");
    expect_usage(&c, "--in x --list 1,2,3,4,5", "--list takes at most 4 values", NULL);
    tcmd(&c, &a, 2);
    expect_usage(&c, "--in x A", "takes A B, got 1 argument", NULL);
    expect_usage(&c, "--in x A B C", "unexpected argument 'C'", NULL);
}

TEST(cli_flags_help_from_the_table) {
    xf_cmd c;
    targs a;
    tcmd(&c, &a, 0);
    a.threads = 7; /* the default shown is the destination's value */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    xf_help(&c, f);
    fclose(f);
    static const char *const want[] = {
        "usage: xent tc --in FILE [options]\n\nAbout tc.\n\noptions:\n",
        "\n  --in FILE ", "input (required)\n",
        "\n  --grad ", "also the gradient (default: off)\n",
        "\n  --reduction none|sum|mean ", "reduction (default: mean)\n",
        "\n  --threads N ", "threads (default: 7)\n",
        "\n  --ignore-index N ", "(default: -100)\n",
        "\n  --label-smoothing X ", "smoothing (default: 0)\n",
        "divides the logits\n                            second line (default: 1)\n",
        "grad dtype (default: the logits dtype)\n",
        "\n  --list LIST ", "numbers (default: none)\n",
        "\n  -h, --help ", "\nEpilog.\n", "exit status: 0 success, 1 bad", "2 usage error",
    };
    for (size_t k = 0; k < sizeof want / sizeof *want; k++)
        CHECK(buf && strstr(buf, want[k]), "help lacks '%s':\n%s", want[k], buf ? buf : "");
    free(buf);
}

TEST(cli_flags_library_messages_use_flag_names) {
    xf_cmd c;
    targs a;
    tcmd(&c, &a, 0);
    char out[512];
    xf_flag_names(&c, "opts.label_smoothing = 2 must be in [0, 1]", out, sizeof out);
    CHECK(!strcmp(out, "--label-smoothing = 2 must be in [0, 1]"), "%s", out);
    xf_flag_names(&c, "opts->threads = -1; ignore_index = 3; temperature stays", out, sizeof out);
    CHECK(!strcmp(out, "--threads = -1; --ignore-index = 3; temperature stays"), "%s", out);
    xf_flag_names(&c, "xopts.label_smoothing, my_ignore_index", out, sizeof out);
    CHECK(!strcmp(out, "xopts.label_smoothing, my_ignore_index"), "not inside a word: %s", out);
    xf_flag_names(&c, "opts.label_smoothing opts.label_smoothing", out, 12);
    CHECK(strlen(out) == 11, "truncated to the buffer: '%s'", out);
    /* a real library message */
    xent_ce_opts o;
    xent_ce_opts_init(&o);
    o.label_smoothing = 2;
    float lg[2] = {0, 1}, loss;
    int64_t lb = 0;
    xent_ce_input in = {lg, XENT_F32, 1, 2, 0, &lb, XENT_I64, NULL};
    xent_ce_output ou;
    memset(&ou, 0, sizeof ou);
    ou.loss = &loss;
    CHECK(xent_ce(&in, &o, &ou) == XENT_ERR_VALUE, "label_smoothing 2 accepted");
    xf_flag_names(&c, xent_last_error(), out, sizeof out);
    CHECK(strstr(out, "--label-smoothing") && !strstr(out, "opts."), "mapped: %s", out);
}

TEST(cli_progress_line_format) {
    char b[256];
    xent_progress_format(b, sizeof b, "xent audit", "variants", 2, 5, 24.0, "fp16");
    CHECK(!strcmp(b, "xent audit: 2/5 variants (now fp16), 12.0 s each, 24 s elapsed, ETA 36 s"),
          "%s", b);
    xent_progress_format(b, sizeof b, "xent x", "items", 0, 10, 3.0, NULL);
    CHECK(!strcmp(b, "xent x: 0/10 items, 3 s elapsed, ETA ?"), "%s", b);
    xent_progress_format(b, sizeof b, "xent x", "resamples", 400, 1000, 2.0, NULL);
    CHECK(!strcmp(b, "xent x: 400/1000 resamples, 200.0 resamples/s, 2 s elapsed, ETA 3 s"),
          "%s", b);
    xent_progress_format(b, sizeof b, "p", "steps", 1, 3, 125.0, NULL);
    CHECK(strstr(b, "2 min 05 s elapsed, ETA 4 min 10 s") != NULL, "%s", b);
    /* off a terminal (the tests' stderr is a file or a pipe) nothing is drawn
     * and a log line passes through */
    CHECK(!xent_progress_wanted(1), "--quiet");
    capture_begin();
    xent_progress *p = xent_progress_start("xent t", "items", 3, xent_progress_wanted(0));
    xent_progress_update(p, 1, "one");
    xent_progress_log(p, "a log line");
    xent_progress_end(p);
    capture_end();
    CHECK(!strcmp(g_err, "a log line\n"), "stderr: '%s'", g_err);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(p, 1, n, f) == n, "write %s", path);
    if (f) fclose(f);
}

/* A version 1.0 .npy with the given descr and shape text, data n bytes. */
static void write_npy(const char *path, const char *descr, const char *shape, const void *data,
                      size_t n) {
    char h[256];
    int len = snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                       descr, shape);
    while ((10 + len + 1) % 64) h[len++] = ' ';
    h[len++] = '\n';
    unsigned char buf[4096];
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)(len & 0xFF);
    buf[9] = (unsigned char)(len >> 8);
    memcpy(buf + 10, h, (size_t)len);
    memcpy(buf + 10 + len, data, n);
    write_bytes(path, buf, 10 + (size_t)len + n);
}

TEST(cli_input_bf16_npy_and_f64) {
    char dir[] = "/tmp/xent_cli_in_XXXXXX", p[256];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    const float vals[6] = {1.0f, -2.5f, 0.15625f, 3e38f, -0.0f, 7.0f};
    uint16_t bf[6];
    for (int i = 0; i < 6; i++) bf[i] = xent_f32_to_bf16(vals[i]);
    snprintf(p, sizeof p, "%s/b.npy", dir);
    write_npy(p, "<V2", "(2, 3)", bf, sizeof bf); /* what numpy writes for ml_dtypes.bfloat16 */
    xent_tensor t;
    capture_begin();
    int rc = xent_cli_load("tc", "--logits", p, &t);
    capture_end();
    CHECK(rc == 0, "'<V2' refused: %s", g_err);
    if (!rc) {
        CHECK(t.dtype == XENT_BF16 && t.ndim == 2 && t.shape[0] == 2 && t.shape[1] == 3 &&
              t.nbytes == 12 && !memcmp(t.data, bf, 12), "bf16 tensor");
        xent_tensor_free(&t);
    }
    /* a spec naming the file of a tensor */
    snprintf(p, sizeof p, "%s/o.lse.npy", dir);
    write_npy(p, "<V2", "(3,)", bf, 6);
    char spec[300];
    snprintf(spec, sizeof spec, "%s/o.npy:lse", dir);
    capture_begin();
    rc = xent_cli_load("tc", "--x", spec, &t);
    capture_end();
    CHECK(rc == 0 && t.dtype == XENT_BF16 && t.shape[0] == 3, "o.npy:lse: %s", g_err);
    if (!rc) xent_tensor_free(&t);
    /* a raw 2-byte void is not bf16: refused with the hint */
    snprintf(p, sizeof p, "%s/v.npy", dir);
    write_npy(p, "|V2", "(2, 3)", bf, sizeof bf);
    capture_begin();
    rc = xent_cli_load("tc", "--logits", p, &t);
    capture_end();
    CHECK(rc == 1 && strstr(g_err, "xent tc: --logits: ") && strstr(g_err, "'|V2'") &&
          strstr(g_err, "ml_dtypes.bfloat16"), "'|V2': rc %d: %s", rc, g_err);
    /* truncated '<V2' data */
    snprintf(p, sizeof p, "%s/short.npy", dir);
    write_npy(p, "<V2", "(2, 3)", bf, 10);
    capture_begin();
    rc = xent_cli_load("tc", "--logits", p, &t);
    capture_end();
    CHECK(rc == 1 && strstr(g_err, "--logits") && strstr(g_err, "short.npy"), "truncated: %s", g_err);
    /* f64 -> f32, rounded once */
    const double dv[4] = {0.1, -1e-45, 1.0 + 0x1p-24, 3.4028235677973366e38};
    snprintf(p, sizeof p, "%s/d.npy", dir);
    write_npy(p, "<f8", "(4,)", dv, sizeof dv);
    capture_begin();
    rc = xent_cli_load("tc", "--x", p, &t) || xent_cli_to_f32("tc", &t);
    capture_end();
    CHECK(rc == 0 && t.dtype == XENT_F32 && t.nbytes == 16, "f64: %s", g_err);
    if (!rc) {
        const float *f = t.data;
        for (int i = 0; i < 4; i++)
            CHECK(f[i] == (float)dv[i] || (isinf(f[i]) && isinf((float)dv[i])),
                  "f64 %d: %a vs %a", i, (double)f[i], (double)(float)dv[i]);
        xent_tensor_free(&t);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

TEST(cli_output_names_checked) {
    char dir[] = "/tmp/xent_cli_out_XXXXXX", in[256], b[512], o1[300], o2[300];
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    xent_cli_out_file("o.npy", "loss", 4, b, sizeof b);
    CHECK(!strcmp(b, "o.loss.npy"), "%s", b);
    xent_cli_out_file("o.npy", "loss", 1, b, sizeof b);
    CHECK(!strcmp(b, "o.npy"), "%s", b);
    xent_cli_out_file("d/o.safetensors", "loss", 4, b, sizeof b);
    CHECK(!strcmp(b, "d/o.safetensors"), "%s", b);
    snprintf(in, sizeof in, "%s/z.safetensors", dir);
    write_bytes(in, "x", 1);
    snprintf(b, sizeof b, "%s:logits", in);
    char f[512];
    xent_cli_spec_file(b, f, sizeof f);
    CHECK(!strcmp(f, in), "spec file: %s", f);
    snprintf(o1, sizeof o1, "%s/o.loss.npy", dir);
    write_bytes(o1, "x", 1);
    snprintf(b, sizeof b, "%s/o.npy:loss", dir);
    xent_cli_spec_file(b, f, sizeof f);
    CHECK(!strcmp(f, o1), "npy spec file: %s", f);
    xent_cli_file ins[1] = {{"--logits", in}};
    xent_cli_file outs[2] = {{"--out", in}, {"--json", NULL}};
    capture_begin();
    int rc = xent_cli_check_outputs("tc", outs, 2, ins, 1);
    capture_end();
    CHECK(rc == 2 && strstr(g_err, "--out") && strstr(g_err, "--logits"), "output = input: %s", g_err);
    snprintf(o2, sizeof o2, "%s/nodir/o.json", dir);
    outs[0] = (xent_cli_file){"--json", o2};
    capture_begin();
    rc = xent_cli_check_outputs("tc", outs, 1, ins, 1);
    capture_end();
    CHECK(rc == 2 && strstr(g_err, "--json") && strstr(g_err, "does not exist"), "missing dir: %s", g_err);
    snprintf(o2, sizeof o2, "%s/r.json", dir);
    outs[0] = (xent_cli_file){"--json", o2};
    outs[1] = (xent_cli_file){"--html", o2};
    capture_begin();
    rc = xent_cli_check_outputs("tc", outs, 2, ins, 1);
    capture_end();
    CHECK(rc == 2 && strstr(g_err, "--json and --html both write"), "same file: %s", g_err);
    outs[1] = (xent_cli_file){"--html", "-"};
    capture_begin();
    rc = xent_cli_check_outputs("tc", outs, 2, ins, 1);
    capture_end();
    CHECK(rc == 0, "fine: %s", g_err);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "cleanup");
}
