/* tools/xent.c: the `xent` command-line tool: dispatch to subcommands. */
#include "cli.h"
#include "xent.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COMMANDS 64
typedef struct { const char *name, *summary; xent_cmd_fn fn; } command;
static command g_cmds[MAX_COMMANDS];
static int g_ncmds;

void xent_cli_register(const char *name, const char *summary, xent_cmd_fn fn) {
    if (g_ncmds < MAX_COMMANDS) g_cmds[g_ncmds++] = (command){name, summary, fn};
}

/* XENT_NUM_THREADS, read once here (the library reads no environment):
 * the default thread count of every command (their --threads 0). Returns 0,
 * or 2 on a bad value. */
static int env_threads(void) {
    const char *s = getenv("XENT_NUM_THREADS");
    if (!s || !*s) return 0;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > 4096) {
        fprintf(stderr, "xent: XENT_NUM_THREADS expects an integer in [0, 4096] (0 = all cores), "
                "got '%s'\n", s);
        return 2;
    }
    xent_set_num_threads((int)v);
    return 0;
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
            "\nenvironment (read by the CLI at startup; the library reads none):\n"
            "  XENT_NUM_THREADS     threads of every command's --threads 0 (default: all cores)\n"
            "  XENT_CACHE           where `make model` puts the default audit model\n"
            "                       (default: $HOME/.cache/xent)\n"
            "  XENT_PROGRESS_AFTER  seconds before a progress line shows (default: 2)\n"
            "\nexit status: 0 success, 1 bad or unreadable data (or a failed check, or a\n"
            "non-finite loss or statistic without --allow-nonfinite), 2 usage error.\n");
}

int main(int argc, char **argv) {
    qsort(g_cmds, (size_t)g_ncmds, sizeof g_cmds[0], cmp_cmd);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "help")) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        if (env_threads()) return 2;
        printf("xent %s\nthreads %d (XENT_NUM_THREADS, else all cores)\n", xent_version(),
               xent_num_threads(0));
        return 0;
    }
    for (int i = 0; i < g_ncmds; i++)
        if (!strcmp(argv[1], g_cmds[i].name)) {
            if (env_threads()) return 2;
            return g_cmds[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "xent: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
