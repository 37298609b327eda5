/* tools/flags.c: the one flag parser of the `xent` commands (flags.h). */
#include "flags.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- values -------------------------------------------------------------- */

int xf_parse_i64(const char *cmd, const char *flag, const char *s, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) {
        fprintf(stderr, "xent %s: %s expects an integer, got '%s'\n", cmd, flag, s);
        return 2;
    }
    *out = (int64_t)v;
    return 0;
}

int xf_parse_f64(const char *cmd, const char *flag, const char *s, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || !isfinite(v) || (errno == ERANGE && fabs(v) > 1)) {
        fprintf(stderr, "xent %s: %s expects a finite number, got '%s'\n", cmd, flag, s);
        return 2;
    }
    *out = v;
    return 0;
}

int xf_parse_f64_list(const char *cmd, const char *flag, const char *s, double *out,
                      int max, int *n) {
    *n = 0;
    if (!*s || !strcmp(s, "none")) return 0;
    const char *p = s;
    for (;;) {
        size_t len = strcspn(p, ",");
        char tok[128];
        if (len == 0 || len >= sizeof tok) {
            fprintf(stderr, "xent %s: %s expects comma-separated numbers, got '%s'\n", cmd, flag, s);
            return 2;
        }
        if (*n >= max) {
            fprintf(stderr, "xent %s: %s takes at most %d values, got '%s'\n", cmd, flag, max, s);
            return 2;
        }
        memcpy(tok, p, len);
        tok[len] = '\0';
        if (xf_parse_f64(cmd, flag, tok, &out[*n])) return 2;
        (*n)++;
        if (!p[len]) return 0;
        p += len + 1;
    }
}

/* "[0, 1]", "> 0", "(0, 80]", or "" without a range. */
static void range_text(const xf_flag *f, char *buf, size_t cap) {
    int lo = (f->flags & XF_MIN) != 0, hi = (f->flags & XF_MAX) != 0;
    int lo_open = (f->flags & XF_LO_OPEN) != 0, hi_open = (f->flags & XF_HI_OPEN) != 0;
    if (lo && hi)
        snprintf(buf, cap, "%c%g, %g%c", lo_open ? '(' : '[', f->lo, f->hi, hi_open ? ')' : ']');
    else if (lo)
        snprintf(buf, cap, "%s %g", lo_open ? ">" : ">=", f->lo);
    else if (hi)
        snprintf(buf, cap, "%s %g", hi_open ? "<" : "<=", f->hi);
    else
        buf[0] = '\0';
}

static int in_range(const xf_flag *f, double v) {
    if (f->flags & XF_MIN) {
        if (f->flags & XF_LO_OPEN ? !(v > f->lo) : !(v >= f->lo)) return 0;
    }
    if (f->flags & XF_MAX) {
        if (f->flags & XF_HI_OPEN ? !(v < f->hi) : !(v <= f->hi)) return 0;
    }
    return 1;
}

/* "none, sum, mean" */
static void choices_text(const xf_flag *f, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int k = 0; f->choices && f->choices[k] && n < cap; k++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", k ? ", " : "", f->choices[k]);
}

static int bad_value(const char *cmd, const xf_flag *f, const char *what, const char *v) {
    char r[96];
    range_text(f, r, sizeof r);
    if (r[0] && (r[0] == '[' || r[0] == '('))
        fprintf(stderr, "xent %s: %s expects %s in %s, got '%s'\n", cmd, f->name, what, r, v);
    else if (r[0])
        fprintf(stderr, "xent %s: %s expects %s %s, got '%s'\n", cmd, f->name, what, r, v);
    else
        fprintf(stderr, "xent %s: %s expects %s, got '%s'\n", cmd, f->name, what, v);
    return 2;
}

/* Stores value v of flag f; returns 0 or 2. */
static int set_value(const xf_cmd *c, xf_flag *f, const char *v) {
    switch (f->kind) {
    case XF_INT: {
        char *end = NULL;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end || !in_range(f, (double)x))
            return bad_value(c->name, f, "an integer", v);
        *(int64_t *)f->dst = (int64_t)x;
        return 0;
    }
    case XF_FLOAT: {
        char *end = NULL;
        double x = strtod(v, &end);
        if (end == v || *end || !isfinite(x) || !in_range(f, x))
            return bad_value(c->name, f, "a number", v);
        *(double *)f->dst = x;
        return 0;
    }
    case XF_STRING:
        if (!*v) {
            fprintf(stderr, "xent %s: %s expects a non-empty value, got ''\n", c->name, f->name);
            return 2;
        }
        *(const char **)f->dst = v;
        return 0;
    case XF_ENUM:
        for (int k = 0; f->choices[k]; k++)
            if (!strcmp(v, f->choices[k])) {
                *(int *)f->dst = f->values ? f->values[k] : k;
                return 0;
            }
        break;
    case XF_DTYPE: {
        xent_dtype d;
        if (xent_dtype_parse(v, &d) == XENT_OK)
            for (int k = 0; f->choices[k]; k++)
                if (!strcmp(xent_dtype_name(d), f->choices[k])) {
                    *(xent_dtype *)f->dst = d;
                    return 0;
                }
        break;
    }
    case XF_FUNC:
        return f->fn(f->dst, v, f->name, c->name) ? 2 : 0;
    case XF_BOOL:
        return 2; /* not reached: a bool takes no value */
    }
    char ch[256];
    choices_text(f, ch, sizeof ch);
    fprintf(stderr, "xent %s: %s got '%s'; accepted: %s\n", c->name, f->name, v, ch);
    return 2;
}

/* ---- lookup and suggestions ---------------------------------------------- */

xf_flag *xf_find(const xf_cmd *c, const char *name) {
    for (int k = 0; k < c->nflags; k++)
        if (!strcmp(c->flags[k].name, name)) return &c->flags[k];
    return NULL;
}

static size_t edit_distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b), row[64];
    if (na >= 63 || nb >= 63) return 99;
    for (size_t j = 0; j <= nb; j++) row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            if (up + 1 < best) best = up + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

static void unknown_flag(const xf_cmd *c, const char *arg, size_t namelen) {
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(namelen < 63 ? namelen : 63), arg);
    const char *best = NULL;
    size_t bd = 3; /* suggest within 2 edits */
    for (int k = 0; k < c->nflags; k++) {
        size_t d = edit_distance(name, c->flags[k].name);
        if (d < bd) bd = d, best = c->flags[k].name;
    }
    if (best)
        fprintf(stderr, "xent %s: unknown flag '%s'; did you mean %s? (see xent %s --help)\n",
                c->name, name, best, c->name);
    else
        fprintf(stderr, "xent %s: unknown flag '%s' (see xent %s --help)\n", c->name, name, c->name);
}

/* ---- parsing ------------------------------------------------------------- */

int xf_parse(xf_cmd *c, int argc, char **argv) {
    int only_pos = 0;
    c->npos = 0;
    for (int k = 0; k < c->nflags; k++) c->flags[k].seen = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int is_flag = !only_pos && a[0] == '-' && a[1] != '\0' &&
                      !(a[1] >= '0' && a[1] <= '9') && a[1] != '.';
        if (!only_pos && !strcmp(a, "--")) { only_pos = 1; continue; }
        if (!is_flag) {
            if (c->npos >= c->max_pos) {
                if (c->max_pos == 0)
                    fprintf(stderr, "xent %s: unexpected argument '%s' (flags start with --; see "
                            "xent %s --help)\n", c->name, a, c->name);
                else
                    fprintf(stderr, "xent %s: unexpected argument '%s' (takes %s)\n", c->name, a,
                            c->pos_help);
                return 2;
            }
            c->pos[c->npos++] = a;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            xf_help(c, stdout);
            return XF_HELP;
        }
        const char *eq = strchr(a, '=');
        size_t namelen = eq ? (size_t)(eq - a) : strlen(a);
        xf_flag *f = NULL;
        for (int k = 0; k < c->nflags && !f; k++)
            if (strlen(c->flags[k].name) == namelen && !strncmp(c->flags[k].name, a, namelen))
                f = &c->flags[k];
        if (!f) {
            unknown_flag(c, a, namelen);
            return 2;
        }
        f->seen++;
        if (f->kind == XF_BOOL) {
            if (eq) {
                fprintf(stderr, "xent %s: %s takes no value, got '%s'\n", c->name, f->name, a);
                return 2;
            }
            *(int *)f->dst = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "xent %s: %s needs a value%s%s\n", c->name, f->name,
                        f->metavar ? " " : "", f->metavar ? f->metavar : "");
                return 2;
            }
            v = argv[++i];
            if (v[0] == '-' && v[1] == '-') {
                fprintf(stderr, "xent %s: %s needs a value, got the flag '%s' (write %s=%s if "
                        "that is the value)\n", c->name, f->name, v, f->name, v);
                return 2;
            }
        }
        if (set_value(c, f, v)) return 2;
    }
    for (int k = 0; k < c->nflags; k++)
        if ((c->flags[k].flags & XF_REQUIRED) && !c->flags[k].seen) {
            fprintf(stderr, "xent %s: %s is required (see xent %s --help)\n", c->name,
                    c->flags[k].name, c->name);
            return 2;
        }
    if (c->npos < c->min_pos) {
        fprintf(stderr, "xent %s: takes %s, got %d argument%s (see xent %s --help)\n", c->name,
                c->pos_help ? c->pos_help : "no arguments", c->npos, c->npos == 1 ? "" : "s",
                c->name);
        return 2;
    }
    return XF_RUN;
}

/* ---- help ------------------------------------------------------------------ */

static const char *metavar(const xf_flag *f, char *buf, size_t cap) {
    if (f->metavar) return f->metavar;
    switch (f->kind) {
    case XF_BOOL: return "";
    case XF_INT: return "N";
    case XF_FLOAT: return "X";
    case XF_ENUM:
    case XF_DTYPE: {
        size_t n = 0;
        buf[0] = '\0';
        for (int k = 0; f->choices[k] && n < cap; k++)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", k ? "|" : "", f->choices[k]);
        return buf;
    }
    default: return "VALUE";
    }
}

/* The default as text: f->def, else the destination's current value. */
static void default_text(const xf_flag *f, char *buf, size_t cap) {
    if (f->def) { snprintf(buf, cap, "%s", f->def); return; }
    switch (f->kind) {
    case XF_BOOL: snprintf(buf, cap, "%s", *(int *)f->dst ? "on" : "off"); return;
    case XF_INT: snprintf(buf, cap, "%lld", (long long)*(int64_t *)f->dst); return;
    case XF_FLOAT: snprintf(buf, cap, "%g", *(double *)f->dst); return;
    case XF_STRING: {
        const char *s = *(const char **)f->dst;
        snprintf(buf, cap, "%s", s ? s : "none");
        return;
    }
    case XF_ENUM:
        for (int k = 0; f->choices[k]; k++)
            if ((f->values ? f->values[k] : k) == *(int *)f->dst) {
                snprintf(buf, cap, "%s", f->choices[k]);
                return;
            }
        break;
    case XF_DTYPE: snprintf(buf, cap, "%s", xent_dtype_name(*(xent_dtype *)f->dst)); return;
    case XF_FUNC: break;
    }
    snprintf(buf, cap, "none");
}

/* Writes s, indenting each continuation line to the help column. */
static void put_indented(FILE *f, const char *s, int width) {
    for (; *s; s++) {
        fputc(*s, f);
        if (*s == '\n') fprintf(f, "  %-*s ", width, "");
    }
}

void xf_help(const xf_cmd *c, FILE *f) {
    fprintf(f, "usage: %s\n\n", c->usage);
    if (c->about) fprintf(f, "%s", c->about);
    int width = c->width;
    if (width <= 0) {
        for (int k = 0; k < c->nflags; k++) {
            char mb[256];
            int n = (int)(strlen(c->flags[k].name) + 1 + strlen(metavar(&c->flags[k], mb, sizeof mb)));
            if (n > width) width = n;
        }
        width = width > 24 ? 24 : width;
        width += 1;
    }
    fprintf(f, "options:\n");
    for (int k = 0; k < c->nflags; k++) {
        const xf_flag *x = &c->flags[k];
        char mb[256], col[320], def[1100];
        const char *mv = metavar(x, mb, sizeof mb);
        snprintf(col, sizeof col, "%s%s%s", x->name, *mv ? " " : "", mv);
        fprintf(f, "  %-*s ", width, col);
        put_indented(f, x->help, width);
        if (x->flags & XF_REQUIRED) {
            fprintf(f, " (required)");
        } else if (!(x->flags & XF_NO_DEFAULT)) {
            default_text(x, def, sizeof def);
            fprintf(f, " (default: ");
            put_indented(f, def, width);
            fputc(')', f);
        }
        fputc('\n', f);
    }
    fprintf(f, "  %-*s this text\n", width, "-h, --help");
    if (c->epilog) fprintf(f, "\n%s", c->epilog);
    fprintf(f, "\nexit status: 0 success, 1 bad or unreadable data (or a failed check%s),\n"
               "2 usage error (a bad flag or value; nothing was computed).\n",
            xf_find(c, "--allow-nonfinite") ? ", or a NaN or\ninfinite result without "
                                              "--allow-nonfinite" : "");
}

/* ---- library messages -------------------------------------------------------- */

static int ident_char(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_';
}

char *xf_flag_names(const xf_cmd *c, const char *msg, char *out, size_t cap) {
    size_t n = 0;
    if (!cap) return out;
    const char *p = msg;
    while (*p && n + 1 < cap) {
        const xf_flag *hit = NULL;
        size_t skip = 0;
        int at_word = p == msg || !ident_char(p[-1]);
        for (int k = 0; at_word && k < c->nflags && !hit; k++) {
            const char *fd = c->flags[k].field;
            if (!fd) continue;
            size_t fl = strlen(fd);
            static const char *const prefixes[] = {"opts->", "opts.", "o->", "o.", ""};
            for (int q = 0; q < 5 && !hit; q++) {
                size_t pl = strlen(prefixes[q]);
                /* bare: only snake_case names, not a member of another struct */
                if (!pl && (!strchr(fd, '_') || (p > msg && (p[-1] == '.' || p[-1] == '>'))))
                    continue;
                if (!strncmp(p, prefixes[q], pl) && !strncmp(p + pl, fd, fl) &&
                    !ident_char(p[pl + fl]))
                    hit = &c->flags[k], skip = pl + fl;
            }
        }
        if (hit) {
            n += (size_t)snprintf(out + n, cap - n, "%s", hit->name);
            if (n >= cap) n = cap - 1;
            p += skip;
        } else {
            out[n++] = *p++;
        }
    }
    out[n] = '\0';
    return out;
}

void xf_lib_error(const xf_cmd *c, const char *what) {
    char buf[2048];
    xf_flag_names(c, xent_last_error(), buf, sizeof buf);
    if (what) fprintf(stderr, "xent %s: %s: %s\n", c->name, what, buf);
    else fprintf(stderr, "xent %s: %s\n", c->name, buf);
}
