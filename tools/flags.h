/* tools/flags.h: the one flag parser of the `xent` commands.
 *
 * A command describes its flags in a table (name, kind, destination, help
 * text, range); xf_parse() fills the destinations from argv and xf_help()
 * writes --help from the same table, so the help, the defaults it shows and
 * the parser cannot disagree. The default shown is the destination's value
 * before parsing (set it first), unless the flag gives its own text.
 *
 * Accepted forms: `--flag value`, `--flag=value`, `--bool`, `-h`/`--help`,
 * `--` (the rest are positional). A value may start with '-' (a negative
 * number) but not with "--" (that is the next flag: the value is missing);
 * `--flag=--x` passes such a value. A repeated flag: the last one counts
 * (XF_FUNC flags see every occurrence).
 *
 * Every error names the flag and the bad value, e.g.
 *   xent ce: --label-smoothing expects a number in [0, 1], got '2'
 * and makes xf_parse() return 2 (usage error). This file depends on the
 * public libxent API only. */
#ifndef XENT_TOOLS_FLAGS_H
#define XENT_TOOLS_FLAGS_H

#include "xent.h"

#include <stdint.h>
#include <stdio.h>

typedef enum xf_kind {
    XF_BOOL,   /* int *: set to 1; takes no value                            */
    XF_INT,    /* int64_t *                                                  */
    XF_FLOAT,  /* double *: finite                                           */
    XF_STRING, /* const char **                                              */
    XF_ENUM,   /* int *: values[k] (or k) for the name choices[k]            */
    XF_DTYPE,  /* xent_dtype *: one of choices (dtype names: "f32", ...)     */
    XF_FUNC    /* fn(dst, value, flag, cmd): the command parses the value    */
} xf_kind;

/* XF_FUNC: returns 0, or prints a message (naming `flag`) and returns 2. */
typedef int (*xf_fn)(void *dst, const char *value, const char *flag, const char *cmd);

enum {
    XF_REQUIRED = 1 << 0, /* the flag must be given                          */
    XF_MIN = 1 << 1,      /* value >= lo (> lo with XF_LO_OPEN)              */
    XF_MAX = 1 << 2,      /* value <= hi (< hi with XF_HI_OPEN)              */
    XF_LO_OPEN = 1 << 3,
    XF_HI_OPEN = 1 << 4,
    XF_NO_DEFAULT = 1 << 5 /* --help shows no "(default: ...)"               */
};

typedef struct xf_flag {
    const char *name;            /* "--label-smoothing"                      */
    xf_kind kind;
    void *dst;
    const char *metavar;         /* "X", "FILE"; NULL: from the kind         */
    const char *help;            /* may hold '\n' (continued, indented)      */
    const char *def;             /* default text; NULL: the dst value        */
    unsigned flags;              /* XF_REQUIRED, XF_MIN, ...                 */
    double lo, hi;               /* range of XF_INT / XF_FLOAT               */
    const char *const *choices;  /* XF_ENUM / XF_DTYPE names, NULL-ended     */
    const int *values;           /* XF_ENUM values (NULL: the index)         */
    xf_fn fn;                    /* XF_FUNC                                  */
    const char *field;           /* the option's C field in library messages
                                    ("label_smoothing"), or NULL             */
    int seen;                    /* set by xf_parse: times given             */
} xf_flag;

typedef struct xf_cmd {
    const char *name;            /* "ce": messages start "xent ce: "         */
    const char *usage;           /* "xent ce --logits FILE ... [options]"    */
    const char *about;           /* text between usage and the flags         */
    const char *epilog;          /* text after the flags, or NULL            */
    xf_flag *flags;
    int nflags;
    int width;                   /* column of the help text; 0: automatic    */
    /* positional arguments */
    const char *pos_help;        /* "A B": names them in messages; NULL: none
                                    accepted                                 */
    int min_pos, max_pos;
    const char **pos;            /* [max_pos], filled by xf_parse            */
    int npos;
} xf_cmd;

/* xf_parse's results other than 2 (usage error). */
enum { XF_RUN = 0, XF_HELP = -1 };

/* Parses argv[1..argc) (argv[0] is the command name). Returns XF_RUN, XF_HELP
 * (help written to stdout: exit 0) or 2 (message on stderr). */
int xf_parse(xf_cmd *c, int argc, char **argv);

/* Writes the help of the command. */
void xf_help(const xf_cmd *c, FILE *f);

/* The flag named `name` of the table, or NULL. */
xf_flag *xf_find(const xf_cmd *c, const char *name);

/* Copies msg into out (cap bytes) with every option field of the table
 * ("opts.label_smoothing", "opts->eps_low", a bare "eps_high") replaced by
 * its flag ("--label-smoothing"). Returns out. */
char *xf_flag_names(const xf_cmd *c, const char *msg, char *out, size_t cap);

/* Prints "xent CMD: WHAT: MSG" with MSG = xent_last_error() through
 * xf_flag_names (what may be NULL). */
void xf_lib_error(const xf_cmd *c, const char *what);

/* Value parsers shared by XF_FUNC flags; each prints "xent CMD: FLAG
 * expects ..., got 'S'" and returns 2 on a bad value, else 0. */
int xf_parse_i64(const char *cmd, const char *flag, const char *s, int64_t *out);
int xf_parse_f64(const char *cmd, const char *flag, const char *s, double *out);
/* A comma-separated list of at most max numbers ("none" or "" = empty). */
int xf_parse_f64_list(const char *cmd, const char *flag, const char *s, double *out,
                      int max, int *n);

#endif
