#!/bin/sh
# tests/stages/compare_rl.sh: `xent compare`'s RL-trainer metrics through
# the binary, against verl's, TRL's and OpenRLHF's formulas written out
# here in plain Python (float64, math only), on a JSON Lines dump with
# prompts, entropies and several sequences:
#   - verl compute_offpolicy_metrics: training_ppl / rollout_ppl (mean over
#     sequences of exp(-mean lp)), kl (mean rollout - train), k3_kl,
#     chi2_token (E[w^2] - 1), chi2_seq (E[exp(2 sum)] - 1); ESS
#   - TRL: sampling_logp_difference mean/max (mean/max |delta|), the
#     sequence_mask fraction at cap 3 (exp of the summed log-ratio > 3)
#   - OpenRLHF ICEPOP: token ratio outside [0.5, 5]
#   - the flags --tis-cap / --mis-cap / --icepop-lo / --icepop-hi move them
#   - the breakdown buckets (position, entropy, frequency) partition the tokens
# Prints "N passed, N failed[, N skipped]" last.
BUILD=${BUILD:-build}
XENT="$BUILD/xent"
if [ ! -x "$XENT" ]; then echo "$XENT not built"; echo "0 passed, 0 failed, 1 skipped"; exit 0; fi
exec python3 - "$XENT" <<'PY'
import json, math, os, random, subprocess, sys, tempfile

xent = os.path.abspath(sys.argv[1])
passed = failed = 0

def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
        print("ok  ", what)
    else:
        failed += 1
        print("FAIL", what)

def close(x, y, tol=1e-12):
    return x is not None and abs(x - y) <= tol * max(1.0, abs(y))

rng = random.Random(46)
d = tempfile.mkdtemp(prefix="xent_cmp_rl_")
seqs = []  # (prompt_len, trainer lps, sampler lps, tokens, entropies)
for q in range(6):
    L = rng.choice([3, 40, 90, 300])
    P = rng.randint(0, 3)
    smp = [-rng.uniform(0.01, 6) for _ in range(L)]
    trn = []
    for s in smp:
        x = s + rng.gauss(0, 0.05) + (math.log(4) if rng.random() < 0.03 else 0)
        trn.append(min(x, -1e-6))
    toks = [int(rng.random() ** 3 * 50) for _ in range(L)]
    ent = [10 ** rng.uniform(-3, 1) for _ in range(L)]
    seqs.append((P, trn, smp, toks, ent))
A, B = os.path.join(d, "trainer.jsonl"), os.path.join(d, "sampler.jsonl")
with open(A, "w") as fa, open(B, "w") as fb:
    for P, trn, smp, toks, ent in seqs:
        fa.write(json.dumps({"tokens": toks, "logprobs": trn, "prompt_len": P, "entropy": ent}) + "\n")
        fb.write(json.dumps({"tokens": toks, "logprobs": smp, "prompt_len": P}) + "\n")

def run(*extra):
    r = subprocess.run([xent, "compare", A, B, "--json", "-", "--quiet", "--bootstrap", "0", *extra],
                       capture_output=True, text=True)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else r.stderr)

rc, j = run()
check(rc == 0, f"compare runs: {j if rc else ''}")
if rc == 0:
    rl = j["rl"]
    # completion tokens, per sequence
    per = [[(t, s) for t, s in zip(trn[P:], smp[P:])] for P, trn, smp, _, _ in seqs]
    flat = [x for p in per for x in p]
    n = len(flat)
    lr = [t - s for t, s in flat]                       # verl log_ratio = old - rollout
    w = [math.exp(max(-20, min(20, x))) for x in lr]
    tr_ppl = sum(math.exp(-sum(t for t, _ in p) / len(p)) for p in per if p) / sum(1 for p in per if p)
    ro_ppl = sum(math.exp(-sum(s for _, s in p) / len(p)) for p in per if p) / sum(1 for p in per if p)
    check(close(rl["sequence"]["ppl_a"], tr_ppl) and close(rl["sequence"]["ppl_b"], ro_ppl),
          f"verl training_ppl / rollout_ppl: {rl['sequence']['ppl_a']} {tr_ppl}")
    check(close(rl["ppl_a"], math.exp(-sum(t for t, _ in flat) / n)), "token perplexity of A")
    check(close(rl["token"]["kl_k1"], sum(s - t for t, s in flat) / n), "verl kl (k1)")
    k3 = sum(math.expm1(x) - x for x in lr) / n
    check(close(rl["token"]["kl_k3"], k3, 1e-9), f"verl k3_kl {rl['token']['kl_k3']} {k3}")
    check(close(rl["token"]["chi2"], sum(x * x for x in w) / n - 1, 1e-11), "verl chi2_token")
    S = [sum(t - s for t, s in p) for p in per if p]
    chi2s = sum(math.exp(2 * max(-20, min(20, x))) for x in S) / len(S) - 1
    check(close(rl["sequence"]["chi2"], chi2s, 1e-11), "verl chi2_seq")
    check(close(rl["token"]["ess"], sum(w) ** 2 / (n * sum(x * x for x in w))), "ESS (token)")
    check(close(rl["token"]["mean_abs_delta"], sum(abs(x) for x in lr) / n) and
          close(j["delta"]["max_abs"], max(abs(x) for x in lr)), "TRL sampling_logp_difference mean/max")
    check(close(rl["sequence"]["mis_frac"], sum(math.exp(x) > 3 for x in S) / len(S)),
          "TRL sequence_mask fraction at cap 3")
    check(close(rl["token"]["tis_frac"], sum(x > 2 for x in w) / n), "TIS fraction at 2")
    check(close(rl["token"]["icepop_frac"], sum(x < 0.5 or x > 5 for x in w) / n),
          "OpenRLHF ICEPOP fraction [0.5, 5]")
    b = rl["breakdown"]
    for key in ("position", "entropy", "frequency"):
        check(b[key] is not None and sum(x["metrics"]["n"] for x in b[key]) == n,
              f"{key} buckets partition the {n} tokens")
    rc2, j2 = run("--tis-cap", "1.5", "--mis-cap", "1.2", "--icepop-lo", "0.95", "--icepop-hi", "1.05")
    t2 = j2["rl"]["token"] if rc2 == 0 else {}
    check(rc2 == 0 and close(t2["tis_frac"], sum(x > 1.5 for x in w) / n) and
          close(t2["mis_frac"], sum(x > 1.2 for x in w) / n) and
          close(t2["icepop_frac"], sum(x < 0.95 or x > 1.05 for x in w) / n),
          "the cap flags move the fractions")
for flag, val in (("--tis-cap", "0"), ("--mis-cap", "nan"), ("--icepop-hi", "-1")):
    r = subprocess.run([xent, "compare", A, B, flag, val], capture_output=True, text=True)
    check(r.returncode == 2 and flag in r.stderr, f"{flag} {val} is a usage error: {r.stderr.strip()}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
