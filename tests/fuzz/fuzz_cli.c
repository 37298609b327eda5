/* tests/fuzz/fuzz_cli.c: libFuzzer target for the CLI's flag parser
 * (tools/flags.c, the one parser of every `xent` command): the input is
 * argv, NUL-separated, parsed against a table with a flag of every kind
 * (bool, int and float with ranges, string, enum, dtype, a callback with a
 * list), then --help and the message renaming are exercised too. Messages
 * go to stderr (run with -close_fd_mask=2 to silence them). Built by
 * `make fuzz`. */
#include "flags.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int parse_list(void *dst, const char *value, const char *flag, const char *cmd) {
    double v[4];
    int n = 0;
    int rc = xf_parse_f64_list(cmd, flag, value, v, 4, &n);
    if (!rc) *(int *)dst = n;
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    char *argv[65];
    int argc = 0;
    argv[argc++] = "fuzz";
    for (size_t i = 0; i < size && argc < 64;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    argv[argc] = NULL;
    int b = 0, e = 0, nl = 0;
    int64_t k = 1;
    double x = 0.5;
    const char *s = NULL, *pos[2] = {NULL, NULL};
    xent_dtype dt = XENT_F32;
    static const char *const enames[] = {"none", "mean", "sum", NULL};
    static const char *const dnames[] = {"f32", "bf16", "f16", NULL};
    xf_flag flags[] = {
        {.name = "--bool", .kind = XF_BOOL, .dst = &b, .help = "a switch"},
        {.name = "--int", .kind = XF_INT, .dst = &k, .help = "an int", .flags = XF_MIN | XF_MAX,
         .lo = 1, .hi = 1e6, .field = "int_field"},
        {.name = "--float", .kind = XF_FLOAT, .dst = &x, .help = "a number",
         .flags = XF_MIN | XF_MAX | XF_LO_OPEN, .lo = 0, .hi = 1, .field = "eps"},
        {.name = "--str", .kind = XF_STRING, .dst = &s, .help = "a string"},
        {.name = "--enum", .kind = XF_ENUM, .dst = &e, .help = "an enum", .choices = enames},
        {.name = "--dtype", .kind = XF_DTYPE, .dst = &dt, .help = "a dtype", .choices = dnames},
        {.name = "--list", .kind = XF_FUNC, .dst = &nl, .help = "numbers", .fn = parse_list},
    };
    xf_cmd c = {.name = "fuzz", .usage = "xent fuzz [options] A [B]", .about = "fuzz target",
                .flags = flags, .nflags = (int)(sizeof flags / sizeof flags[0]),
                .pos_help = "A B", .min_pos = 0, .max_pos = 2, .pos = pos};
    int rc = xf_parse(&c, argc, argv);
    if (rc != XF_RUN && rc != XF_HELP && rc != 2) abort();
    if (rc == XF_RUN) {
        if (k < 1 || k > 1000000 || !(x > 0 && x <= 1) || c.npos > 2) abort();
        char out[256];
        xf_flag_names(&c, "opts.eps and int_field out of range", out, sizeof out);
    }
    free(buf);
    return 0;
}
