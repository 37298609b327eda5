/* src/compare/run.c: `xent compare` end to end: load the sources, merge the
 * side data (token ids, boundaries, masks) with consistency checks, compute
 * and write the outputs. */
#include "compare/compare.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum { SA, SB, SR, SRB, SE, STA, STB, NSRC };

typedef struct {
    xent__cmp_series s[NSRC];  /* A, B, ref, ref-b, entropy, tokens-a, -b */
    const char *name[NSRC];
    int64_t *offsets;          /* from --offsets                          */
    int64_t noff;
    int64_t *maskv;            /* from --mask                             */
    int64_t nmaskv;
    uint8_t *mask;             /* [n] from --mask                         */
    uint8_t *sel;              /* [n] the mask ANDed with the JSONL masks */
} inputs;

static void inputs_free(inputs *in) {
    for (int k = 0; k < NSRC; k++) xent__cmp_series_free(&in->s[k]);
    free(in->offsets);
    free(in->maskv);
    free(in->mask);
    free(in->sel);
}

static int fail_msg(FILE *err) {
    fprintf(err, "xent compare: %s\n", xent_last_error());
    return 1;
}

static xent_status load_all(const xent__cmp_cfg *cfg, inputs *in) {
    const char *lp[5] = {cfg->a, cfg->b, cfg->ref, cfg->ref_b, cfg->entropy};
    xent_status s;
    if (cfg->ref_b && !cfg->ref)
        return xent_set_error(XENT_ERR_VALUE, "--ref-b needs --ref (A's reference)");
    for (int k = 0; k < 5; k++) {
        const char *key = k == SA ? cfg->key_a : k == SB ? cfg->key_b : NULL;
        xent__cmp_keys keys = {key, k == SA ? "--key-a" : "--key-b", cfg->key_mask, "--key-mask"};
        in->name[k] = lp[k];
        if (lp[k] && (s = xent__cmp_load_logprobs_keys(lp[k], &keys, &in->s[k]))) return s;
    }
    in->name[STA] = cfg->tokens_a;
    in->name[STB] = cfg->tokens_b;
    if (cfg->tokens_a && (s = xent__cmp_load_ids(cfg->tokens_a, &in->s[STA]))) return s;
    if (cfg->tokens_b && (s = xent__cmp_load_ids(cfg->tokens_b, &in->s[STB]))) return s;
    if (cfg->offsets && (s = xent__cmp_load_ints(cfg->offsets, &in->offsets, &in->noff))) return s;
    if (cfg->mask && (s = xent__cmp_load_ints(cfg->mask, &in->maskv, &in->nmaskv))) return s;
    return XENT_OK;
}

static xent_status check_lengths(const inputs *in) {
    int64_t n = in->s[SA].n;
    for (int k = 1; k < NSRC; k++) {
        const xent__cmp_series *x = &in->s[k];
        static const char *const what[] = {"A", "B", "ref", "--ref-b", "--entropy"};
        if (k <= SE && in->name[k] && x->n != n)
            return xent_set_error(XENT_ERR_SHAPE, "lengths differ: A (%s) has %" PRId64
                              " log-probs, %s (%s) has %" PRId64 "%s", in->name[SA], n,
                              what[k], in->name[k], x->n, k == SE ? " values" : "");
    }
    for (int k = 0; k < NSRC; k++) {
        const xent__cmp_series *x = &in->s[k];
        if (x->tokens && x->ntok != n)
            return xent_set_error(XENT_ERR_SHAPE, "%s has %" PRId64 " token ids but the "
                              "log-probs have %" PRId64, in->name[k], x->ntok, n);
    }
    return XENT_OK;
}

/* "position 17 (sequence 2, index 5)" */
static void pos_text(char *buf, size_t cap, int64_t i, const int64_t *off, int64_t nseq) {
    int64_t q = 0;
    if (off) while (q + 1 < nseq && off[q + 1] <= i) q++;
    if (off) snprintf(buf, cap, "position %" PRId64 " (sequence %" PRId64 ", index %" PRId64 ")",
                      i, q, i - off[q]);
    else snprintf(buf, cap, "position %" PRId64, i);
}

/* The token ids of A (from --tokens-a, else A's file) and of B. */
static const int64_t *side_tokens(const inputs *in, int lp, int ids, int *from) {
    if (in->s[ids].tokens) { *from = ids; return in->s[ids].tokens; }
    *from = lp;
    return in->s[lp].tokens;
}

static xent_status check_tokens(const inputs *in, const int64_t *off, int64_t nseq,
                                const int64_t **tokens) {
    int fa, fb;
    const int64_t *ta = side_tokens(in, SA, STA, &fa), *tb = side_tokens(in, SB, STB, &fb);
    const int64_t *tr = in->s[SR].tokens;
    *tokens = ta ? ta : tb;
    int64_t n = in->s[SA].n;
    const int64_t *other[2] = {ta && tb ? tb : NULL, *tokens && tr ? tr : NULL};
    const char *oname[2] = {in->name[fb], in->name[SR]};
    for (int k = 0; k < 2; k++) {
        if (!other[k]) continue;
        for (int64_t i = 0; i < n; i++) {
            if ((*tokens)[i] == other[k][i]) continue;
            char where[128];
            pos_text(where, sizeof where, i, off, nseq);
            return xent_set_error(XENT_ERR_VALUE, "token ids differ at %s: %s has %" PRId64
                              ", %s has %" PRId64, where, in->name[ta ? fa : fb],
                              (*tokens)[i], oname[k], other[k][i]);
        }
    }
    return XENT_OK;
}

/* Boundaries: --offsets, else the first source that has them; every other
 * source that has them must agree. Id sources count only with several
 * sequences (a flat array says nothing about boundaries). */
static xent_status merge_offsets(const inputs *in, const int64_t **off, int64_t *nseq,
                                 const char **from) {
    *off = NULL;
    *nseq = 0;
    if (in->offsets) {
        if (in->noff < 2)
            return xent_set_error(XENT_ERR_SHAPE, "%s: offsets need at least 2 entries "
                              "(0 and the token count)", *from = "--offsets");
        *off = in->offsets;
        *nseq = in->noff - 1;
        *from = "--offsets";
    }
    for (int k = 0; k < NSRC; k++) {
        const xent__cmp_series *x = &in->s[k];
        if (!x->offsets || (k >= STA && x->nseq < 2)) continue;
        if (!*off) { *off = x->offsets; *nseq = x->nseq; *from = in->name[k]; continue; }
        if (x->nseq != *nseq || memcmp(x->offsets, *off, (size_t)(*nseq + 1) * sizeof **off))
            return xent_set_error(XENT_ERR_VALUE, "sequence boundaries differ: %s has %" PRId64
                              " sequences, %s has %" PRId64 " (or other lengths)",
                              *from, *nseq, in->name[k], x->nseq);
    }
    return XENT_OK;
}

static xent_status merge_mask(inputs *in, const uint8_t **mask) {
    int64_t n = in->s[SA].n;
    const char *from = NULL;
    *mask = NULL;
    if (in->maskv) {
        if (in->nmaskv != n)
            return xent_set_error(XENT_ERR_SHAPE, "--mask has %" PRId64 " entries but the "
                              "log-probs have %" PRId64, in->nmaskv, n);
        in->mask = malloc((size_t)n); /* [n] */
        if (!in->mask) return xent_set_error(XENT_ERR_ALLOC, "compare: out of memory");
        for (int64_t i = 0; i < n; i++) {
            if (in->maskv[i] != 0 && in->maskv[i] != 1)
                return xent_set_error(XENT_ERR_VALUE, "mask[%" PRId64 "] = %" PRId64
                                  " is not 0 or 1", i, in->maskv[i]);
            in->mask[i] = (uint8_t)in->maskv[i];
        }
        *mask = in->mask;
        from = "--mask";
    }
    for (int k = 0; k <= SE; k++) {
        const xent__cmp_series *x = &in->s[k];
        if (!x->mask) continue;
        if (!*mask) { *mask = x->mask; from = in->name[k]; continue; }
        for (int64_t i = 0; i < n; i++)
            if (x->mask[i] != (*mask)[i])
                return xent_set_error(XENT_ERR_VALUE, "completion masks differ at position %"
                                  PRId64 ": %s says %s, %s says %s", i, from,
                                  (*mask)[i] ? "completion" : "prompt", in->name[k],
                                  x->mask[i] ? "completion" : "prompt");
    }
    /* per-token masks of the JSON Lines ("mask"): a token is selected only
     * where every one of them says 1 (and the prompt mask / --mask does) */
    int any = 0;
    for (int k = 0; k <= SE; k++) any |= in->s[k].lmask != NULL;
    if (!any) return XENT_OK;
    in->sel = malloc((size_t)(n ? n : 1)); /* [n] */
    if (!in->sel) return xent_set_error(XENT_ERR_ALLOC, "compare: out of memory");
    for (int64_t i = 0; i < n; i++) in->sel[i] = *mask ? (*mask)[i] : 1;
    for (int k = 0; k <= SE; k++) {
        const xent__cmp_series *x = &in->s[k];
        if (!x->lmask) continue;
        if (x->nlmask != n) /* the reader checks each line; a guard */
            return xent_set_error(XENT_ERR_SHAPE, "%s: the mask has %" PRId64 " entries but the "
                              "log-probs have %" PRId64, in->name[k], x->nlmask, n);
        for (int64_t i = 0; i < n; i++) in->sel[i] &= x->lmask[i];
    }
    *mask = in->sel;
    return XENT_OK;
}

/* A report goes to PATH.tmp.XXXXXX and is renamed over PATH only when
 * complete (xent_file_commit): a failed run leaves an old report intact. */
static int open_out(FILE *err, const char *path, FILE **f, char **tmp) {
    *tmp = NULL;
    if (!strcmp(path, "-")) { *f = stdout; return 0; }
    *f = xent_file_create(path, tmp);
    if (!*f) { fprintf(err, "xent compare: cannot write %s: %s\n", path, xent_last_error()); return 1; }
    return 0;
}

static int close_out(FILE *err, FILE *f, char *tmp, const char *path) {
    if (f == stdout) {
        int bad = ferror(f) || fflush(f) != 0;
        if (bad) fprintf(err, "xent compare: error writing %s\n", path);
        return bad;
    }
    if (xent_file_commit(f, tmp, path, !ferror(f)) != XENT_OK) {
        fprintf(err, "xent compare: error writing %s: %s\n", path, xent_last_error());
        return 1;
    }
    return 0;
}

/* Per-token entropy for the breakdown: --entropy (its "entropy" if it is
 * JSON Lines, else its values), else the "entropy" of the reference's,
 * then A's, then B's JSON Lines. */
static xent_status pick_entropy(const inputs *in, const double **ent) {
    *ent = NULL;
    const xent__cmp_series *e = &in->s[SE];
    if (in->name[SE]) {
        if (xent__cmp_format(in->name[SE]) == XENT__FMT_JSON) {
            if (!e->ent)
                return xent_set_error(XENT_ERR_FORMAT, "--entropy %s: the JSON Lines have no "
                                  "\"entropy\"", in->name[SE]);
            *ent = e->ent;
        } else {
            *ent = e->lp;
        }
        return XENT_OK;
    }
    const int order[4] = {SR, SRB, SA, SB};
    for (int k = 0; k < 4 && !*ent; k++) *ent = in->s[order[k]].ent;
    return XENT_OK;
}

static int write_outputs(const xent__cmp_cfg *cfg, const xent__cmp_result *r,
                         const char *const names[4]) {
    FILE *f, *err = cfg->err ? cfg->err : stderr;
    char *tmp = NULL;
    int rc = 0;
    if (!cfg->quiet) xent__cmp_print_table(stdout, r, &cfg->opts, names);
    if (cfg->json) {
        if (open_out(err, cfg->json, &f, &tmp)) return 1;
        xent__cmp_write_json(f, r, &cfg->opts);
        rc |= close_out(err, f, tmp, cfg->json);
    }
    if (cfg->html) {
        if (open_out(err, cfg->html, &f, &tmp)) return 1;
        xent__cmp_write_html(f, r, &cfg->opts, names);
        rc |= close_out(err, f, tmp, cfg->html);
    }
    return rc;
}

const char *xent__cmp_nonfinite(const xent__cmp_result *r) {
    const struct { double v; const char *name; } s[] = {
        {r->mean, "mean delta"}, {r->rms, "RMS delta"}, {r->sum, "sum of delta"},
        {r->max_abs, "max |delta|"}, {r->clip_ratio, "ratio clip fraction"},
        {r->clip_log, "log clip fraction"}};
    for (size_t k = 0; k < sizeof s / sizeof *s; k++)
        if (!isfinite(s[k].v)) return s[k].name;
    return NULL;
}

static void refuse_bad(FILE *err, const xent__cmp_result *r, const char *const names[4]) {
    fprintf(err, "xent compare: %s\n", xent_last_error());
    xent__cmp_print_bad(err, r, names);
    fprintf(err, "no statistics computed. Fix the dumps, or rerun with --exclude-bad to "
            "leave these tokens out of every statistic (a run of exact zeros counts as bad "
            "from --zero-run tokens on).\n");
}

int xent__cmp_run(const xent__cmp_cfg *cfg) {
    inputs in;
    memset(&in, 0, sizeof in);
    xent__cmp_result r;
    memset(&r, 0, sizeof r);
    const char *names[4] = {cfg->a, cfg->b, cfg->ref ? cfg->ref : "-",
                            cfg->ref_b ? cfg->ref_b : "-"};
    const int64_t *off = NULL, *tokens = NULL;
    const double *ent = NULL;
    const uint8_t *mask = NULL;
    int64_t nseq = 0;
    const char *off_from = NULL;
    int rc = 1;
    FILE *err = cfg->err ? cfg->err : stderr;
    xent_status s = load_all(cfg, &in);
    if (!s) s = check_lengths(&in);
    if (!s) s = merge_offsets(&in, &off, &nseq, &off_from);
    if (!s) s = check_tokens(&in, off, nseq, &tokens);
    if (!s) s = merge_mask(&in, &mask);
    if (!s) s = pick_entropy(&in, &ent);
    if (s) { rc = fail_msg(err); goto done; }
    xent__cmp_data d = {in.s[SA].lp, in.s[SB].lp, cfg->ref ? in.s[SR].lp : NULL,
                        in.s[SA].n, tokens, off, nseq, mask,
                        cfg->ref_b ? in.s[SRB].lp : NULL, ent};
    s = xent__cmp_compute(&d, &cfg->opts, &r);
    if (s) {
        if (r.n_excluded && !cfg->opts.exclude_bad) refuse_bad(err, &r, names);
        else fail_msg(err);
        goto done;
    }
    rc = write_outputs(cfg, &r, names);
    const char *bad = xent__cmp_nonfinite(&r);
    if (!rc && bad && !cfg->allow_nonfinite) {
        fprintf(err, "xent compare: the %s is not finite; exit 1 (--allow-nonfinite "
                "accepts it)\n", bad);
        rc = 1;
    }
done:
    xent__cmp_result_free(&r);
    inputs_free(&in);
    return rc;
}
