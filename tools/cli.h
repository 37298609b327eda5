/* tools/cli.h: subcommands of the `xent` binary.
 * Each subcommand lives in its own tools/cmd_*.c and registers itself:
 *   XENT_COMMAND(ce, "cross-entropy of a logits file", cmd_ce)
 * where `int cmd_ce(int argc, char **argv)` gets argv[0] == "ce" and returns
 * the process exit code: 0 success, 1 bad or unreadable data (or a failed
 * check, or a non-finite result without --allow-nonfinite), 2 usage error.
 * Flags are parsed by tools/flags.h, the one parser of every command. */
#ifndef XENT_CLI_H
#define XENT_CLI_H

#include "flags.h"

#include <stdint.h>
#include <stdio.h>

typedef int (*xent_cmd_fn)(int argc, char **argv);
void xent_cli_register(const char *name, const char *summary, xent_cmd_fn fn);

#define XENT_COMMAND(name, summary, fn)                                    \
    __attribute__((constructor)) static void xent_cli_reg_##name(void) {   \
        xent_cli_register(#name, summary, fn);                             \
    }

/* The help line of --allow-nonfinite, the same in every command. */
#define XENT_CLI_NONFINITE_HELP \
    "exit 0 even when a loss or statistic is NaN or infinite"

#endif
