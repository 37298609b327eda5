/* src/audit/variants.c: precision variants of `xent audit`.
 * A variant is a name plus key=value overrides of the all-fp32 policy. */
#include "audit/audit.h"
#include "xent/io.h"
#include "core/xent_math.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

#define ACCEPTED_KEYS                                                        \
    "compute, residual, norm, attn_softmax, lm_head, logits, grad_accum, "   \
    "all, ce, micro_batches, loss_scale"
#define ACCEPTED_DTYPES "fp32, bf16, fp16"

const char *xent__audit_dtype_name(xent_dtype t) {
    switch (t) {
    case XENT_F32: return "fp32";
    case XENT_BF16: return "bf16";
    case XENT_F16: return "fp16";
    default: return "?";
    }
}

static int parse_dtype(const char *s, xent_dtype *out) {
    xent_dtype t;
    if (xent_dtype_parse(s, &t) != XENT_OK) return -1;
    if (t != XENT_F32 && t != XENT_BF16 && t != XENT_F16) return -1;
    *out = t;
    return 0;
}

const char *xent__audit_ce_name(xent_ce_form f) { return xent__ce_form_name(f); }

static int parse_ce(const char *s, xent_ce_form *out) {
    return xent__ce_form_parse(s, out);
}

static void ce_list(char *buf, size_t n) {
    buf[0] = 0;
    for (int f = 0; f < XENT_CE_FORM_COUNT; f++) {
        size_t l = strlen(buf);
        snprintf(buf + l, n - l, "%s%s", f ? ", " : "",
                 xent__ce_form_name((xent_ce_form)f));
    }
}

/* The dtype field a key names, or NULL. */
static xent_dtype *dtype_field(xent_precision *p, const char *key) {
    if (!strcmp(key, "compute")) return &p->compute;
    if (!strcmp(key, "residual")) return &p->residual;
    if (!strcmp(key, "norm")) return &p->norm;
    if (!strcmp(key, "attn_softmax")) return &p->attn_softmax;
    if (!strcmp(key, "lm_head")) return &p->lm_head;
    if (!strcmp(key, "logits")) return &p->logits;
    if (!strcmp(key, "grad_accum")) return &p->grad_accum;
    return NULL;
}

static xent_status set_all(xent_precision *p, xent_dtype t) {
    p->compute = p->residual = p->norm = t;
    p->attn_softmax = p->lm_head = p->logits = t;
    return XENT_OK;
}

static xent_status bad_value(const char *vname, const char *key,
                             const char *val, const char *accepted) {
    return xent_set_error(XENT_ERR_VALUE,
                      "variant '%s': %s=%s is not accepted (accepted: %s)",
                      vname, key, val, accepted);
}

static xent_status parse_int_value(const char *vname, const char *key,
                                   const char *val, int *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < 1 || v > 1 << 20)
        return bad_value(vname, key, val, "an integer in [1, 1048576]");
    *out = (int)v;
    return XENT_OK;
}

static xent_status parse_scale(const char *vname, const char *val,
                               double *out) {
    if (!strcmp(val, "auto")) { *out = 0; return XENT_OK; }
    char *end = NULL;
    errno = 0;
    double v = strtod(val, &end);
    if (errno || end == val || *end || !(v > 0) || !isfinite(v))
        return bad_value(vname, "loss_scale", val,
                         "auto, or a finite number > 0 (1 = no scaling)");
    *out = v;
    return XENT_OK;
}

/* Applies one "key=value" to *p. */
static xent_status apply_kv(const char *vname, const char *kv,
                            xent_precision *p) {
    const char *eq = strchr(kv, '=');
    char key[64];
    if (!eq || eq == kv || (size_t)(eq - kv) >= sizeof key)
        return xent_set_error(XENT_ERR_VALUE,
                          "variant '%s': '%s' is not key=value (keys: %s)",
                          vname, kv, ACCEPTED_KEYS);
    memcpy(key, kv, (size_t)(eq - kv));
    key[eq - kv] = 0;
    const char *val = eq + 1;
    xent_dtype *f = dtype_field(p, key);
    if (f || !strcmp(key, "all")) {
        xent_dtype t;
        if (parse_dtype(val, &t)) return bad_value(vname, key, val, ACCEPTED_DTYPES);
        if (f) *f = t;
        else set_all(p, t);
        return XENT_OK;
    }
    if (!strcmp(key, "ce")) {
        if (parse_ce(val, &p->ce) == 0) return XENT_OK;
        char list[160];
        ce_list(list, sizeof list);
        return bad_value(vname, key, val, list);
    }
    if (!strcmp(key, "micro_batches"))
        return parse_int_value(vname, key, val, &p->micro_batches);
    if (!strcmp(key, "loss_scale")) return parse_scale(vname, val, &p->loss_scale);
    return xent_set_error(XENT_ERR_VALUE,
                      "variant '%s': unknown key '%s' (accepted keys: %s)",
                      vname, key, ACCEPTED_KEYS);
}

static xent_audit_variant make_default(const char *name, xent_dtype body,
                                       int fp32_head) {
    xent_audit_variant v;
    memset(&v, 0, sizeof v);
    snprintf(v.name, sizeof v.name, "%s", name);
    v.p = xent_precision_fp32();
    set_all(&v.p, body);
    if (fp32_head) v.p.lm_head = v.p.logits = XENT_F32;
    if (body == XENT_F16) v.p.loss_scale = 0; /* auto: calibrated */
    return v;
}

void xent__audit_default_variants(xent_audit_variants *out) {
    memset(out, 0, sizeof *out);
    out->v[out->n++] = make_default("fp32", XENT_F32, 0);
    out->v[out->n++] = make_default("bf16", XENT_BF16, 0);
    out->v[out->n++] = make_default("bf16_fp32head", XENT_BF16, 1);
    out->v[out->n++] = make_default("fp16", XENT_F16, 0);
    out->v[out->n++] = make_default("fp16_fp32head", XENT_F16, 1);
}

static xent_status check_name(const char *name, size_t len) {
    if (len == 0)
        return xent_set_error(XENT_ERR_VALUE, "variant: empty name (form: "
                          "NAME:key=value,key=value)");
    if (len >= XENT_AUDIT_NAME_MAX)
        return xent_set_error(XENT_ERR_VALUE, "variant name '%.*s' is longer than "
                          "%d characters", (int)len, name, XENT_AUDIT_NAME_MAX - 1);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!isalnum(c) && c != '_' && c != '-' && c != '.' && c != '+')
            return xent_set_error(XENT_ERR_VALUE, "variant name '%.*s': character "
                              "'%c' at %zu (use letters, digits, _ - . +)",
                              (int)len, name, c, i);
    }
    return XENT_OK;
}

/* Splits the override list on ',' and whitespace and applies each. */
static xent_status apply_list(const char *vname, const char *s,
                              xent_precision *p) {
    while (*s) {
        while (*s == ',' || isspace((unsigned char)*s)) s++;
        if (!*s) break;
        size_t len = strcspn(s, ", \t\r\n");
        char kv[256];
        if (len >= sizeof kv)
            return xent_set_error(XENT_ERR_VALUE, "variant '%s': override '%.40s...'"
                              " is too long", vname, s);
        memcpy(kv, s, len);
        kv[len] = 0;
        xent_status st = apply_kv(vname, kv, p);
        if (st) return st;
        s += len;
    }
    return XENT_OK;
}

xent_status xent__audit_variant_parse(const char *spec, xent_audit_variant *out) {
    if (!spec || !out) return xent_set_error(XENT_ERR_NULL, "variant spec is NULL");
    while (isspace((unsigned char)*spec)) spec++;
    size_t len = strcspn(spec, ": \t\r\n");
    xent_status st = check_name(spec, len);
    if (st) return st;
    xent_audit_variant v;
    memset(&v, 0, sizeof v);
    memcpy(v.name, spec, len);
    v.name[len] = 0;
    const char *rest = spec + len;
    while (isspace((unsigned char)*rest)) rest++;
    if (*rest == ':') rest++;
    if (!*rest) { /* a bare name: one of the defaults, else refuse */
        xent_audit_variants d;
        xent__audit_default_variants(&d);
        for (int i = 0; i < d.n; i++)
            if (!strcmp(d.v[i].name, v.name)) { *out = d.v[i]; return XENT_OK; }
        return xent_set_error(XENT_ERR_VALUE,
                          "variant '%s' has no overrides and is not a default "
                          "(defaults: fp32, bf16, bf16_fp32head, fp16, "
                          "fp16_fp32head; or NAME:key=value,...)", v.name);
    }
    v.p = xent_precision_fp32();
    st = apply_list(v.name, rest, &v.p);
    if (st) return st;
    *out = v;
    return XENT_OK;
}

xent_status xent__audit_variants_add(xent_audit_variants *list,
                                     const xent_audit_variant *v) {
    for (int i = 0; i < list->n; i++)
        if (!strcmp(list->v[i].name, v->name))
            return xent_set_error(XENT_ERR_VALUE, "variant '%s' is given twice",
                              v->name);
    if (list->n >= XENT_AUDIT_MAX_VARIANTS)
        return xent_set_error(XENT_ERR_VALUE, "more than %d variants",
                          XENT_AUDIT_MAX_VARIANTS);
    list->v[list->n++] = *v;
    return XENT_OK;
}

xent_status xent__audit_variants_file(const char *path,
                                      xent_audit_variants *list) {
    FILE *f = xent_file_open(path, NULL); /* a regular file only: never blocks */
    if (!f) return XENT_ERR_IO; /* the message names the path */
    char line[1024];
    int lineno = 0;
    xent_status st = XENT_OK;
    while (!st && fgets(line, sizeof line, f)) {
        lineno++;
        size_t l = strlen(line);
        if (l == sizeof line - 1 && line[l - 1] != '\n' && !feof(f)) {
            st = xent_set_error(XENT_ERR_FORMAT, "%s:%d: line longer than %zu bytes",
                            path, lineno, sizeof line - 2);
            break;
        }
        const char *s = line;
        while (isspace((unsigned char)*s)) s++;
        if (!*s || *s == '#') continue;
        xent_audit_variant v;
        st = xent__audit_variant_parse(s, &v);
        if (!st) st = xent__audit_variants_add(list, &v);
        if (st) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", xent_last_error());
            st = xent_set_error(st, "%s:%d: %s", path, lineno, msg);
        }
    }
    fclose(f);
    return st;
}

int xent__audit_is_reference(const xent_precision *p) {
    return p->compute == XENT_F32 && p->residual == XENT_F32 &&
           p->norm == XENT_F32 && p->attn_softmax == XENT_F32 &&
           p->lm_head == XENT_F32 && p->logits == XENT_F32 &&
           p->grad_accum == XENT_F32 && p->ce == XENT_CE_EXACT &&
           p->micro_batches == 1 && (p->loss_scale == 1 || p->loss_scale == 0);
}

xent_status xent__audit_find_reference(const xent_audit_variants *list,
                                       int *ref) {
    if (list->n == 0)
        return xent_set_error(XENT_ERR_VALUE, "no variants given");
    for (int i = 0; i < list->n; i++)
        if (xent__audit_is_reference(&list->v[i].p)) { *ref = i; return XENT_OK; }
    return xent_set_error(XENT_ERR_VALUE,
                      "the variant list has no fp32 reference (a variant with "
                      "every dtype fp32, ce=exact, micro_batches=1, loss_scale "
                      "1 or auto): add --variant fp32");
}

void xent__audit_policy_str(const xent_precision *p, char *buf, size_t n) {
    char scale[32];
    if (p->loss_scale == 0) snprintf(scale, sizeof scale, "auto");
    else snprintf(scale, sizeof scale, "%g", p->loss_scale);
    snprintf(buf, n,
             "compute=%s residual=%s norm=%s attn_softmax=%s lm_head=%s "
             "logits=%s ce=%s grad_accum=%s micro_batches=%d loss_scale=%s",
             xent__audit_dtype_name(p->compute),
             xent__audit_dtype_name(p->residual),
             xent__audit_dtype_name(p->norm),
             xent__audit_dtype_name(p->attn_softmax),
             xent__audit_dtype_name(p->lm_head),
             xent__audit_dtype_name(p->logits), xent__audit_ce_name(p->ce),
             xent__audit_dtype_name(p->grad_accum), p->micro_batches, scale);
}
