/* tools/cli.h: subcommands of the `xent` binary.
 * Each subcommand lives in its own tools/cmd_*.c and registers itself:
 *   XENT_COMMAND(ce, "cross-entropy of a logits file", cmd_ce)
 * where `int cmd_ce(int argc, char **argv)` gets argv[0] == "ce" and returns
 * the process exit code (0 ok, 1 failure, 2 usage error). */
#ifndef XENT_CLI_H
#define XENT_CLI_H

#include <stdint.h>
#include <stdio.h>

typedef int (*xent_cmd_fn)(int argc, char **argv);
void xent_cli_register(const char *name, const char *summary, xent_cmd_fn fn);

#define XENT_COMMAND(name, summary, fn)                                    \
    __attribute__((constructor)) static void xent_cli_reg_##name(void) {   \
        xent_cli_register(#name, summary, fn);                             \
    }

/* Small shared helpers for option parsing; each prints a message naming the
 * flag and returns nonzero on a bad value. */
int xent_cli_parse_i64(const char *flag, const char *s, int64_t *out);
int xent_cli_parse_f64(const char *flag, const char *s, double *out);
/* argv[*i] is a flag that takes a value: returns the value and advances *i,
 * or prints "FLAG needs a value" and returns NULL. */
const char *xent_cli_value(int argc, char **argv, int *i);

#endif
