/* tools/input.c: input tensors and output names of the `xent` commands
 * (input.h). */
#include "input.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

void xent_cli_spec_file(const char *spec, char *buf, size_t cap) {
    snprintf(buf, cap, "%s", spec);
    if (is_file(spec)) return;
    for (const char *c = strchr(spec, ':'); c; c = strchr(c + 1, ':')) {
        char file[4096];
        size_t n = (size_t)(c - spec);
        if (n >= sizeof file) break;
        memcpy(file, spec, n);
        file[n] = '\0';
        if (!is_file(file)) continue;
        if (ends_with(file, ".npy")) { /* X.npy:NAME -> X.NAME.npy */
            snprintf(buf, cap, "%.*s.%s.npy", (int)(n - 4), file, c + 1);
            return;
        }
        snprintf(buf, cap, "%s", file);
        return;
    }
    /* X.npy:NAME where only X.NAME.npy exists */
    const char *c = strstr(spec, ".npy:");
    if (c) snprintf(buf, cap, "%.*s.%s.npy", (int)(c - spec), spec, c + 5);
}

void xent_cli_out_file(const char *path, const char *name, int n, char *buf, size_t cap) {
    if (n > 1 && ends_with(path, ".npy"))
        snprintf(buf, cap, "%.*s.%s.npy", (int)(strlen(path) - 4), path, name);
    else
        snprintf(buf, cap, "%s", path);
}

int xent_cli_load(const char *cmd, const char *flag, const char *spec, xent_tensor *out) {
    if (xent_tensor_load(spec, out) == XENT_OK) return 0;
    fprintf(stderr, "xent %s: %s: %s\n", cmd, flag, xent_last_error());
    return 1;
}

int xent_cli_to_f32(const char *cmd, xent_tensor *t) {
    if (t->dtype != XENT_F64) return 0;
    int64_t n = xent_tensor_numel(t);
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof *f);
    if (!f) {
        fprintf(stderr, "xent %s: out of memory converting %lld f64 values to f32\n", cmd,
                (long long)n);
        return 1;
    }
    const double *d = t->data;
    for (int64_t i = 0; i < n; i++) f[i] = (float)d[i]; /* round to nearest, once */
    free(t->data);
    t->data = f;
    t->dtype = XENT_F32;
    t->nbytes = (size_t)n * sizeof *f;
    return 0;
}

/* ---- outputs ------------------------------------------------------------------ */

static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    return !strcmp(a, b);
}

int xent_cli_check_outputs(const char *cmd, const xent_cli_file *outs, int nouts,
                           const xent_cli_file *ins, int nins) {
    for (int i = 0; i < nouts; i++) {
        const char *p = outs[i].path;
        if (!p || !strcmp(p, "-")) continue;
        char dir[4096];
        const char *slash = strrchr(p, '/');
        if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash == p ? 1 : slash - p), p);
        else snprintf(dir, sizeof dir, ".");
        struct stat st;
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "xent %s: %s %s: the directory '%s' does not exist\n", cmd,
                    outs[i].flag, p, dir);
            return 2;
        }
        if (access(dir, W_OK) != 0) {
            fprintf(stderr, "xent %s: %s %s: the directory '%s' is not writable\n", cmd,
                    outs[i].flag, p, dir);
            return 2;
        }
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            fprintf(stderr, "xent %s: %s %s is a directory\n", cmd, outs[i].flag, p);
            return 2;
        }
        for (int j = 0; j < i; j++)
            if (outs[j].path && same_file(outs[j].path, p)) {
                fprintf(stderr, "xent %s: %s and %s both write %s\n", cmd, outs[j].flag,
                        outs[i].flag, p);
                return 2;
            }
        for (int j = 0; j < nins; j++)
            if (ins[j].path && same_file(ins[j].path, p)) {
                fprintf(stderr, "xent %s: %s would write %s, the file %s reads\n", cmd,
                        outs[i].flag, p, ins[j].flag);
                return 2;
            }
    }
    return 0;
}
