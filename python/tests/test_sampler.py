"""xent.sampler_logprobs against (1) an mpmath reference of the rules in
docs/sampler.md (60 digits, each output within 1 ulp of it), and (2) vLLM's
own processed-logprobs formula re-implemented in NumPy from its source:

  vllm/v1/sample/sampler.py                       commit 3e342658b2e9c85a  (Sampler.sample: temperature,
                                                  then the argmax-invariant logits processors (min-p),
                                                  then TopKTopPSampler; compute_logprobs = log_softmax)
  vllm/v1/sample/logits_processor/builtin.py      commit bf17660a2493b9ce  (MinPLogitsProcessor.apply)
  vllm/v1/sample/ops/topk_topp_sampler.py         commit 01fa3fe74b058bb6  (apply_top_k_top_p_pytorch,
                                                  forward_native: processed_logprobs = log_softmax)

Seeds: XENT_TEST_SEED (printed in the header and at the end)."""
import math

import numpy as np
import pytest

import xent
from xent import _sampler

mpmath = pytest.importorskip("mpmath")


# ---------------------------------------------------------------- references

def mp_reference(z, tau, k, p, min_p, label):
    """The rules of docs/sampler.md in 60-digit arithmetic on one row."""
    mp = mpmath.mp
    mp.dps = 60
    V = len(z)
    order = sorted(range(V), key=lambda j: -float(z[j]))
    zmax = mp.mpf(float(z[order[0]]))
    d = [(mp.mpf(float(z[j])) - zmax) / mp.mpf(tau) for j in range(V)]
    e = [mp.exp(x) for x in d]
    n1 = V
    if min_p > 0:
        lm = mp.log(mp.mpf(min_p))
        n1 = sum(1 for j in order if d[j] >= lm)
    if 0 < k < n1:
        vk = z[order[k - 1]]
        n1 = k
        while n1 < V and z[order[n1]] == vk:
            n1 += 1
    S1 = mp.fsum(e[j] for j in order[:n1])
    n = n1
    if p < 1:
        target, c = mp.mpf(p) * S1, mp.mpf(0)
        for n in range(1, n1 + 1):
            c += e[order[n - 1]]
            if c >= target:
                break
    kept = order[:n]
    SK = mp.fsum(e[j] for j in kept)
    R = mp.fsum(e[j] for j in order[n:])
    # log S as log1p(S - 1), S - 1 summed apart (the max columns are 1)
    top = [j for j in range(V) if z[j] == z[order[0]]]
    L = mp.log1p(len([j for j in top if j in kept]) - 1
                 + mp.fsum(e[j] for j in kept if z[j] != z[order[0]]))
    Lall = mp.log1p(len(top) - 1
                    + mp.fsum(e[j] for j in range(V) if z[j] != z[order[0]]))
    H = L + mp.fsum(e[j] * -d[j] for j in kept) / SK
    lkm = -mp.log1p(R / SK)
    lp = d[label] - L if z[label] >= z[order[n - 1]] else -mp.inf
    return dict(logprob=lp, logprob_full=d[label] - Lall, kept=n,
                log_kept_mass=lkm, entropy=H)


def _softmax(x):
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(-1, keepdims=True)


def _log_softmax(x):
    m = np.max(x, axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def vllm_processed_logprobs(logits, temperature, top_k, top_p, min_p,
                            dtype=np.float64):
    """vLLM v1's logprobs_mode="processed_logprobs", line for line, in NumPy
    (float64 by default; vLLM itself runs it in float32 torch)."""
    x = logits.astype(dtype) / dtype(temperature)        # apply_temperature
    if min_p > 0:                                        # MinPLogitsProcessor
        probs = _softmax(x)
        adjusted = probs.max(-1, keepdims=True) * dtype(min_p)
        x = np.where(probs < adjusted, -np.inf, x)
    if top_k or top_p < 1:                          # apply_top_k_top_p_pytorch
        B, V = x.shape
        idx = np.argsort(x, axis=-1, kind="stable")   # ascending
        xs = np.take_along_axis(x, idx, -1)
        if top_k:
            kk = min(top_k, V)
            thr = xs[:, V - kk][:, None]
            xs = np.where(xs < thr, -np.inf, xs)
        if top_p < 1:
            cs = np.cumsum(_softmax(xs), -1)
            mask = cs <= 1 - dtype(top_p)
            mask[:, -1] = False                        # at least one
            xs = np.where(mask, -np.inf, xs)
        out = np.empty_like(x)
        np.put_along_axis(out, idx, xs, -1)
        x = out
    with np.errstate(invalid="ignore"):
        return _log_softmax(x)                        # compute_logprobs


def ulp_err(x, ref):
    """|x - ref| in float32 ulps at ref (ref an mpmath number)."""
    if mpmath.isinf(ref) or math.isinf(x):
        return 0.0 if (math.isinf(x) and mpmath.isinf(ref)
                       and (x < 0) == (ref < 0)) else 1e30
    a = abs(float(ref))
    u = 2.0 ** (math.frexp(a)[1] - 24) if a else 2.0 ** -149
    u = max(u, 2.0 ** -149)
    return float(abs(mpmath.mpf(float(x)) - ref) / u)


def _params(rng, V):
    return dict(temperature=float(rng.choice([1.0, 0.6, 1.7, 0.05])),
                top_k=int(rng.integers(1, V + 2)) if rng.random() < .5 else 0,
                top_p=float(rng.uniform(.05, 1)) if rng.random() < .7 else 1.0,
                min_p=float(rng.uniform(0, .3)) if rng.random() < .3 else 0.0)


AMBIG = _sampler.MINP_NEAR | _sampler.TOPP_NEAR


# ---------------------------------------------------------------- tests

def test_vs_mpmath(rng):
    worst, rows = 0.0, 0
    for rep in range(60):
        V = int(rng.integers(1, 40))
        z = (rng.standard_normal((3, V)) * rng.uniform(.5, 6)).astype(np.float32)
        if rep % 3 == 0:
            z = np.round(z)                       # ties
        lab = rng.integers(0, V, 3)
        prm = _params(rng, V)
        r = xent.sampler_logprobs(z, lab, **prm)
        for i in range(3):
            if r.flags[i] & AMBIG:
                continue
            ref = mp_reference(z[i], prm["temperature"], prm["top_k"],
                               prm["top_p"], prm["min_p"], int(lab[i]))
            assert r.kept[i] == ref["kept"], (prm, z[i], r.kept[i], ref["kept"])
            for key in ("logprob", "logprob_full", "log_kept_mass", "entropy"):
                e = ulp_err(float(getattr(r, key)[i]), ref[key])
                worst = max(worst, e)
                assert e <= 1.0, (key, prm, z[i].tolist(), float(getattr(r, key)[i]), ref[key])
            rows += 1
    print("mpmath: %d rows, worst %.4f ulp" % (rows, worst))
    assert rows > 100


def test_vs_vllm_formula(rng):
    """vLLM's formula (float64) and xent agree on every row whose cut is
    decided with margin 1e-9; labels in a partly kept tie group are
    excluded (their membership is the sort's tie order)."""
    checked = dropped = 0
    for rep in range(40):
        V = int(rng.integers(2, 3000))
        B = 4
        z = (rng.standard_normal((B, V)) * rng.uniform(1, 5)).astype(np.float32)
        if rep % 4 == 0:
            z = np.round(z * 2) / 2
        lab = rng.integers(0, V, B)
        prm = _params(rng, V)
        r = xent.sampler_logprobs(z, lab, boundary_tol=1e-9, **prm)
        ref = vllm_processed_logprobs(z, **prm)
        for i in range(B):
            if r.flags[i] & AMBIG:
                continue
            kept_v = int(np.isfinite(ref[i]).sum())
            assert r.kept[i] == kept_v, (prm, i, r.kept[i], kept_v)
            if r.flags[i] & _sampler.LABEL_AMBIGUOUS:
                continue
            want = ref[i, lab[i]]
            got = r.logprob[i]
            if np.isinf(want):
                assert np.isinf(got) and got < 0, (prm, got, want)
                dropped += 1
            else:
                assert abs(got - want) <= 1e-6 * (1 + abs(want)), (prm, got, want)
            checked += 1
    print("vLLM formula: %d labels (%d dropped)" % (checked, dropped))
    assert checked > 100 and dropped > 5


def test_topp_boundary_and_ties():
    # two columns: m1 = 1 / (1 + e^-0.75); p just below / at / above m1
    z = np.array([[0.0, -0.75]], np.float32)
    m1 = 1 / (1 + math.exp(-0.75))
    r = xent.sampler_logprobs(z, [1], top_p=m1 * (1 - 1e-9))
    assert r.kept[0] == 1 and r.flags[0] == 0 and np.isinf(r.logprob[0]) and r.n_dropped == 1
    r = xent.sampler_logprobs(z, [1], top_p=m1 * (1 + 1e-9))
    assert r.kept[0] == 2 and r.flags[0] == 0
    r = xent.sampler_logprobs(z, [1], top_p=m1)
    assert r.flags[0] & _sampler.TOPP_NEAR and r.flags[0] & _sampler.LABEL_AMBIGUOUS
    assert r.n_ambiguous == 1
    # vLLM with fp32 arithmetic can disagree within 1e-6: boundary_tol flags it
    r = xent.sampler_logprobs(z, [1], top_p=m1 * (1 + 1e-7), boundary_tol=1e-6)
    assert r.flags[0] & _sampler.TOPP_NEAR
    # a tie group at the cut: 1000 equal logits, top_p 0.3 -> 300 kept
    r = xent.sampler_logprobs(np.zeros((1, 1000), np.float32), [5], top_p=0.3)
    assert r.kept[0] == 300 and r.flags[0] & _sampler.TOPP_TIE
    assert abs(r.logprob[0] + math.log(300)) <= 1e-6
    assert "topp_tie" in _sampler.flag_names(r.flags[0])
    # top-k ties: all values tied with the k-th are kept (vLLM's `<` mask)
    r = xent.sampler_logprobs(np.array([[3, 2, 2, 2, 1]], np.float32), [4], top_k=2)
    assert r.kept[0] == 4 and r.flags[0] == _sampler.TOPK_TIE and np.isinf(r.logprob[0])


def test_dtypes_torch_and_shapes(rng):
    torch = pytest.importorskip("torch")
    z = torch.randn(2, 3, 257, dtype=torch.float32) * 3
    lab = torch.randint(0, 257, (2, 3))
    lab[0, 1] = -100
    prm = dict(temperature=0.9, top_k=40, top_p=0.8, min_p=0.02)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        zt = z.to(dt)
        r = xent.sampler_logprobs(zt, lab, **prm)
        assert r.logprob.shape == (2, 3) and isinstance(r.logprob, torch.Tensor)
        assert r.logprob[0, 1] == 0 and r.n_counted == 5
        # the same bits through NumPy (float32 view of the same values)
        rn = xent.sampler_logprobs(zt.float().numpy(), lab.numpy(), **prm)
        assert np.array_equal(r.logprob.numpy(), rn.logprob)
        assert np.array_equal(r.entropy.numpy(), rn.entropy)
        for i in range(2):
            for j in range(3):
                if r.flags[i, j] & AMBIG or lab[i, j] < 0:
                    continue
                ref = mp_reference(zt.float()[i, j].numpy(), prm["temperature"],
                                   prm["top_k"], prm["top_p"], prm["min_p"],
                                   int(lab[i, j]))
                assert int(r.kept[i, j]) == ref["kept"]
                assert ulp_err(float(r.logprob[i, j]), ref["logprob"]) <= 1
                assert ulp_err(float(r.entropy[i, j]), ref["entropy"]) <= 1


def test_huge_and_v1(rng):
    z = np.array([[3e38, -3e38, 3e38, 1e38, -3.4e38, 2.9999998e38]], np.float32)
    for tau in (1.0, 1e-3, 1e30):
        for prm in (dict(top_p=0.7), dict(top_k=2, min_p=0.1), dict()):
            r = xent.sampler_logprobs(z, [3], temperature=tau, **prm)
            ref = mp_reference(z[0], tau, prm.get("top_k", 0),
                               prm.get("top_p", 1.0), prm.get("min_p", 0.0), 3)
            if r.flags[0] & AMBIG:
                continue
            assert r.kept[0] == ref["kept"]
            for key in ("logprob", "logprob_full", "entropy", "log_kept_mass"):
                v = float(getattr(r, key)[0])
                refv = ref[key]
                if abs(refv) > 3.4028235677973366e38:   # rounds to inf
                    assert math.isinf(v)
                else:
                    assert ulp_err(v, refv) <= 1, (key, tau, prm, v, refv)
    r = xent.sampler_logprobs(np.array([[-7.0]], np.float32), [0], top_p=0.1,
                              top_k=1, min_p=0.5)
    assert r.logprob[0] == 0 and r.entropy[0] == 0 and r.kept[0] == 1


def test_errors():
    z = np.zeros((1, 4), np.float32)
    with pytest.raises(xent.XentError, match=r"top_p = 1.5 is outside \(0, 1\]"):
        xent.sampler_logprobs(z, [0], top_p=1.5)
    with pytest.raises(xent.XentError, match=r"min_p = 1 is outside \[0, 1\)"):
        xent.sampler_logprobs(z, [0], min_p=1.0)
    with pytest.raises(xent.XentError, match=r"labels\[0\] = 4 is outside"):
        xent.sampler_logprobs(z, [4])
    r = xent.sampler_logprobs(z, None)
    assert r.n_counted == 0 and r.logprob[0] == 0
