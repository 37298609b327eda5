/* tools/xent.c: the `xent` command-line tool: dispatch to subcommands. */
#include "cli.h"
#include "xent.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COMMANDS 64
typedef struct { const char *name, *summary; xent_cmd_fn fn; } command;
static command g_cmds[MAX_COMMANDS];
static int g_ncmds;

void xent_cli_register(const char *name, const char *summary, xent_cmd_fn fn) {
    if (g_ncmds < MAX_COMMANDS) g_cmds[g_ncmds++] = (command){name, summary, fn};
}

int xent_cli_parse_i64(const char *flag, const char *s, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) {
        fprintf(stderr, "xent: %s expects an integer, got '%s'\n", flag, s);
        return 1;
    }
    *out = (int64_t)v;
    return 0;
}

int xent_cli_parse_f64(const char *flag, const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || isnan(v)) {
        fprintf(stderr, "xent: %s expects a number, got '%s'\n", flag, s);
        return 1;
    }
    *out = v;
    return 0;
}

const char *xent_cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "xent: %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static int cmp_cmd(const void *a, const void *b) {
    return strcmp(((const command *)a)->name, ((const command *)b)->name);
}

static void usage(FILE *f) {
    fprintf(f,
            "xent %s: exact token log-probabilities and cross-entropy\n\n"
            "usage: xent COMMAND [options]     (xent COMMAND --help for its flags)\n\n"
            "commands:\n",
            xent_version());
    for (int i = 0; i < g_ncmds; i++)
        fprintf(f, "  %-10s %s\n", g_cmds[i].name, g_cmds[i].summary);
    fprintf(f,
            "\nenvironment:\n"
            "  XENT_NUM_THREADS   threads for the CPU kernels (default: all cores)\n");
}

int main(int argc, char **argv) {
    qsort(g_cmds, (size_t)g_ncmds, sizeof g_cmds[0], cmp_cmd);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "help")) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("xent %s\n", xent_version());
        return 0;
    }
    for (int i = 0; i < g_ncmds; i++)
        if (!strcmp(argv[1], g_cmds[i].name)) return g_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "xent: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
