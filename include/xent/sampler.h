/* xent/sampler.h: processed log-probs, the distribution a sampler draws
 * from after temperature, min-p, top-k and top-p (vLLM's v1 sampler; the
 * rules, their source files and the error analysis are in docs/sampler.md).
 * Included by xent.h; do not include directly.
 *
 * Per row of logits z (the first V columns), with x_j = z_j / temperature
 * in exact arithmetic, the kept set K is (in vLLM's order):
 *   1. min-p  (min_p > 0):  keep j iff  p_j >= min_p * max_i p_i,
 *                           i.e. x_j - max x >= ln(min_p);
 *   2. top-k  (0 < top_k < number kept): keep j iff z_j >= the top_k-th
 *                           largest value of the row (every column tied with
 *                           it is kept, so K may hold more than top_k);
 *   3. top-p  (top_p < 1):  over the distribution renormalized on the set
 *                           kept so far, keep the n largest where n is the
 *                           smallest count whose mass is >= top_p (a mass of
 *                           exactly top_p keeps those n).
 * The processed distribution is q_j = exp(x_j) / sum_{i in K} exp(x_i) on K,
 * 0 elsewhere. Per counted row (label t != ignore_index):
 *   logprob       log q_t, or -inf when t is outside K (counted in n_dropped)
 *   logprob_full  log of softmax(x)_t (the full temperature-scaled row)
 * and per row (all rows):
 *   kept          |K|
 *   log_kept_mass log( sum_K exp(x) / sum_all exp(x) )  (<= 0; 0 when
 *                 nothing was removed)
 *   entropy       -sum_K q_j log q_j
 *   flags         XENT_SAMPLER_* bits below.
 * Every float output is within 1 ulp of the exact value of the rule above
 * for the kept set K reported (docs/sampler.md, "Error bound"). The kept
 * set itself is exact unless a flag says otherwise: MINP_NEAR / TOPP_NEAR
 * mean a relative perturbation of the probabilities within the library's
 * error bound (2^-40 of the row's mass for top-p, 2^-50 of |x| for min-p),
 * or within opts->boundary_tol, could move the cut; the outputs are then
 * those of the side the computation landed on.
 *
 * Ignored rows have logprob and logprob_full 0 (not counted). A row with a
 * NaN or infinite logit has NaN float outputs, kept 0 and flags 0, and is
 * counted in n_nonfinite (and, when it has a label, in n_counted). Every
 * output row depends only on that row (bitwise, whatever T and threads). */
#ifndef XENT_SAMPLER_H
#define XENT_SAMPLER_H
#ifdef __cplusplus
extern "C" {
#endif

/* flags bits */
#define XENT_SAMPLER_MINP_NEAR 1  /* a column is within the bound of the
                                     min-p threshold                       */
#define XENT_SAMPLER_TOPP_NEAR 2  /* the top-p mass at the cut (n or n-1
                                     columns) is within the bound of top_p */
#define XENT_SAMPLER_TOPP_TIE 4   /* the top-p cut falls inside a group of
                                     equal logits: only some of them are
                                     kept (the count, masses and entropy are
                                     exact; which members are kept depends
                                     on a sort's tie order)                */
#define XENT_SAMPLER_TOPK_TIE 8   /* top-k kept more than top_k columns
                                     because of ties at the k-th value
                                     (vLLM's rule; informational)          */
#define XENT_SAMPLER_LABEL_AMBIGUOUS 16 /* the label's own membership is
                                     undecided: it sits in the partly kept
                                     tie group (its logprob is then the
                                     kept value), or next to a NEAR cut     */

typedef struct xent_sampler_opts {
    double temperature;   /* default 1; finite and > 0                      */
    int64_t top_k;        /* default 0 (off); >= 0; >= V is off             */
    double top_p;         /* default 1 (off); in (0, 1]                     */
    double min_p;         /* default 0 (off); in [0, 1)                     */
    int64_t ignore_index; /* default -100                                   */
    double boundary_tol;  /* default 0; in [0, 1): also flag a cut that a
                             relative perturbation of this size of every
                             probability could move (e.g. 1e-6 to find rows
                             where an fp32 sampler may disagree)            */
    int threads;          /* default 0: xent_set_num_threads's, else all    */
} xent_sampler_opts;

/* Every pointer may be NULL (that output is not written). */
typedef struct xent_sampler_output {
    float *logprob;        /* [T] log q_t; -inf outside K; 0 if ignored      */
    float *logprob_full;   /* [T] log softmax(z / temperature)_t; 0 ignored  */
    int64_t *kept;         /* [T] |K|                                        */
    float *log_kept_mass;  /* [T] log of the kept mass (<= 0)                */
    float *entropy;        /* [T] entropy of q                               */
    int32_t *flags;        /* [T] XENT_SAMPLER_* bits                        */
    int64_t *n_counted;    /* rows with a label                              */
    int64_t *n_dropped;    /* counted rows whose label is outside K          */
    int64_t *n_ambiguous;  /* rows with MINP_NEAR, TOPP_NEAR or TOPP_TIE     */
    int64_t *n_nonfinite;  /* rows with a NaN or infinite logit              */
} xent_sampler_output;

XENT_API void xent_sampler_opts_init(xent_sampler_opts *o);

/* CPU. `in` as for xent_logprobs (labels may be NULL: every row ignored;
 * grad_rows is not used); opts NULL means the defaults. Labels outside
 * [0, V) that are not ignore_index give XENT_ERR_LABEL and nothing is
 * written. */
XENT_API xent_status xent_sampler_logprobs(const xent_ce_input *in,
                                           const xent_sampler_opts *opts,
                                           xent_sampler_output *out);

/* CUDA: every array (logits, labels and every field of *out) is DEVICE
 * memory; the structs are host memory; stream is a cudaStream_t (NULL: the
 * legacy default stream). Labels are checked by a small kernel first (the
 * call waits for its 8-byte result): a bad label gives XENT_ERR_LABEL and
 * nothing is written. The kept set is found by bisection on the value axis
 * with block reductions (one block a row); the sums are in double in
 * another order than the CPU's, so outputs agree with the CPU within the
 * same bound (1 ulp of the exact value each), not bitwise. V < 2^31.
 * Without CUDA: XENT_ERR_UNSUPPORTED. */
XENT_API xent_status xent_cuda_sampler_logprobs(const xent_ce_input *in,
                                                const xent_sampler_opts *opts,
                                                xent_sampler_output *out,
                                                void *stream);

#ifdef __cplusplus
}
#endif
#endif /* XENT_SAMPLER_H */
