"""RL loss math through Python (xent.group_advantages, batch_normalize,
policy_loss, kl, rl_diagnostics, check_logprobs): the known-failure
cases, agreement with float64 NumPy formulas, bad inputs. NumPy only (runs
in CI); the torch tests at the end skip where torch is absent.

Tolerance of the formula checks (derived): the library evaluates every
per-token quantity in double from the float32 inputs and rounds once at the
float32 store; the reference below evaluates the same formula in float64.
Each side's double result is within a few double roundings of the exact
value, relative to the magnitudes of the terms it combined: below 2^-48 *
mag for the short expressions here (at most ~8 operations of 2^-53 each,
and exp accurate to a few ulps), where mag is the sum of the terms'
magnitudes. The float32 store adds at most 1 ulp(f32) of the result. So
|out - ref| <= ulp_f32(ref) + 2^-47 * mag. Double aggregates (the loss,
means, diagnostics) add the recursive-sum bound (n - 1) 2^-53 sum|x| on
each side: for n <= 2^10 tokens, below 2^-42 * sum|x|."""
import numpy as np
import pytest

import xent
from util import ulp

INF = np.inf


def close_f32(out, ref, mag, what):
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, what
    assert np.all(np.isfinite(out)), "%s: non-finite output" % what
    tol = ulp(ref) + 2.0 ** -47 * np.asarray(mag, dtype=np.float64)
    bad = np.flatnonzero(np.abs(out - ref).reshape(-1) > tol.reshape(-1))
    assert bad.size == 0, "%s: %d off, first [%d]: %r vs %r" % (
        what, bad.size, bad[0], out.reshape(-1)[bad[0]],
        ref.reshape(-1)[bad[0]])


def close_sum(got, ref, summag, what):
    assert np.isfinite(got), what
    assert abs(got - ref) <= 2.0 ** -42 * summag, "%s: %r vs %r" % (
        what, got, ref)


def poison(shape):
    """float32 output buffer of 0xFF bytes (NaN) to show it stays untouched."""
    a = np.empty(shape, np.float32)
    a.view(np.uint32)[...] = 0xFFFFFFFF
    return a


def untouched(a):
    return np.all(a.view(np.uint32) == 0xFFFFFFFF)


def raises_with(fn, *needles, status=None):
    with pytest.raises(xent.XentError) as ei:
        fn()
    msg = str(ei.value)
    for s in needles:
        assert s in msg, "%r not in %r" % (s, msg)
    if status is not None:
        assert ei.value.status == status, msg
    return msg


# ---------------------------------------------------------------- advantages

ANCHOR_GROUPS = [[0.1] * 7, [0.1] * 8, [0.3] * 16, [0.2] * 3]


@pytest.mark.parametrize("std", ["population", "sample", "none"])
@pytest.mark.parametrize("eps", [0.0, 1e-9, 1e-6, 1e-4])
def test_equal_groups_exact_zero(std, eps):
    """Known failure (docs/rl.md): a float mean of [0.1]*7 leaves -7.45e-9 (-7.45 after
    / (0 + 1e-9)); xent gives exactly +0 for every equal group."""
    for g in ANCHOR_GROUPS:
        for r in (np.array(g, np.float32), np.array(g, np.float64), g):
            for kw in ({"group_ids": np.zeros(len(g), np.int64)},
                       {"offsets": [0, len(g)]}):
                a, info = xent.group_advantages(r, std=std, eps=eps, **kw)
                assert a.dtype == np.float32
                assert np.all(a.view(np.uint32) == 0), (g, std, eps, a)
                assert info["n_zero_var"] == 1 and info["n_groups"] == 1
    # all four as rows of one [G, K] array (ragged: ids instead)
    r = np.concatenate([np.array(g, np.float32) for g in ANCHOR_GROUPS])
    ids = np.repeat(np.arange(4), [len(g) for g in ANCHOR_GROUPS])
    a, info = xent.group_advantages(r, ids, std=std, eps=eps)
    assert np.all(a.view(np.uint32) == 0) and info["n_zero_var"] == 4
    a, _ = xent.group_advantages(np.full((5, 7), 0.1, np.float32), std=std,
                                 eps=eps)
    assert a.shape == (5, 7) and np.all(a.view(np.uint32) == 0)


def test_singleton_and_empty_groups():
    a, info = xent.group_advantages([3.0, 1.0, 2.0], offsets=[0, 1, 1, 3],
                                    std="sample")
    assert a[0] == 0 and not np.signbit(a[0])
    assert info["n_singleton"] == 1 and info["n_empty"] == 1
    assert info["n_zero_var"] == 1 and info["n_groups"] == 2


def test_subtract_mean_false_keeps_equal_rewards():
    a, _ = xent.group_advantages([[0.5] * 4], subtract_mean=False, eps=1e-9)
    assert np.all(a == np.float32(0.5))          # never 0.5 / 1e-9


def ref_advantages(r, ids, std, eps, subtract_mean=True):
    r = r.astype(np.float64)
    out = np.empty_like(r)
    mag = np.empty_like(r)
    for g in np.unique(ids):
        m = ids == g
        x = r[m]
        if np.all(x == x[0]):
            out[m] = 0.0 if subtract_mean else x
            mag[m] = np.abs(x)
            continue
        mu = x.mean()
        sd = {"population": x.std(), "sample": x.std(ddof=1),
              "none": 1.0}[std]
        e = 0.0 if std == "none" else eps
        out[m] = ((x - mu) if subtract_mean else x) / (sd + e)
        mag[m] = (np.abs(x) + abs(mu)) / (sd + e) * len(x)
    return out, mag


@pytest.mark.parametrize("std", ["population", "sample", "none"])
def test_advantages_match_float64(rng, std):
    sizes = rng.integers(1, 9, size=40)
    ids = np.repeat(np.arange(sizes.size), sizes)
    r = (rng.standard_normal(ids.size) * 3).astype(np.float32)
    r[rng.random(ids.size) < 0.3] = 1.0         # some equal groups
    for eps in (0.0, 1e-6):
        a, info = xent.group_advantages(r, ids, std=std, eps=eps)
        ref, mag = ref_advantages(r, ids, std, eps)
        close_f32(a, ref, mag, "advantages std=%s eps=%g" % (std, eps))
        a2, _ = xent.group_advantages(r, ids, std=std, eps=eps,
                                      subtract_mean=False)
        ref2, mag2 = ref_advantages(r, ids, std, eps, False)
        close_f32(a2, ref2, mag2 + mag, "subtract_mean=False")
        assert info["group_mean"].shape == (sizes.size,)


def test_population_vs_sample_factor(rng):
    """sample / population advantages = sqrt((n - 1) / n) exactly up to the
    two float32 stores (each within 1/2 ulp: ratio within 2^-23)."""
    for n in (2, 4, 7, 16):
        r = rng.standard_normal((3, n)).astype(np.float32)
        pop, ip = xent.group_advantages(r, std="population", eps=0.0)
        smp, is_ = xent.group_advantages(r, std="sample", eps=0.0)
        ratio = smp.astype(np.float64) / pop.astype(np.float64)
        assert np.all(np.abs(ratio - np.sqrt((n - 1) / n)) <= 2.0 ** -22)
        assert np.allclose(ip["group_std"] * np.sqrt(n / (n - 1)),
                           is_["group_std"], rtol=2.0 ** -50, atol=0)
        assert np.array_equal(ip["group_std"],
                              r.astype(np.float64).std(axis=1)) or \
            np.allclose(ip["group_std"], r.astype(np.float64).std(axis=1),
                        rtol=2.0 ** -48, atol=0)


def test_advantages_bad_input_untouched():
    r = np.array([0.0, 1, 2, 3, 4, np.nan, 6], np.float32)
    out = poison(r.shape)
    raises_with(lambda: xent.group_advantages(r, [0, 0, 0, 1, 1, 1, 1],
                                              out=out), "[5]", "not finite",
                status=5)
    assert untouched(out)
    r[5] = 5
    raises_with(lambda: xent.group_advantages(r, [0, 0, 1, 0, 1, 1, 1],
                                              out=out), "ids[3]",
                "non-decreasing")
    raises_with(lambda: xent.group_advantages(r, [0, 0, 0, 1, 1, 1, 1],
                                              ngroups=1, out=out),
                "ids[3] = 1 is outside [0, 1)")
    raises_with(lambda: xent.group_advantages(r, [0, 0, 1], out=out),
                "group_ids shape")
    raises_with(lambda: xent.group_advantages(r, offsets=[0, 3, 8],
                                              out=out), "offsets")
    raises_with(lambda: xent.group_advantages(r, [0] * 7, std="n-1"),
                "std = 'n-1'")
    raises_with(lambda: xent.group_advantages(r), "group_ids or offsets")
    assert untouched(out)
    a, _ = xent.group_advantages(r, [0] * 7, out=r)      # in place
    assert a is r and abs(float(r.sum())) < 1e-5


# ------------------------------------------------------- batch normalisation

def test_all_zero_pack_stays_zero():
    a, info = xent.batch_normalize(np.zeros(64, np.float32))
    assert np.all(a.view(np.uint32) == 0) and info["degenerate"]
    a, info = xent.batch_normalize(np.zeros(8), kind="std",
                                   subtract_mean=True)
    assert np.all(a == 0) and not np.any(np.isnan(a)) and info["degenerate"]


def test_residual_pack_zeros_stay_zero(rng):
    """Known failure (docs/rl.md): [0.1]*8 in float64 leaves 1.39e-11, which a pack
    normalisation by mean|A| scales to O(1). Through xent the equal group is
    exactly 0 and stays 0; the other entries are A / mean|A|."""
    r = np.concatenate([np.full(8, 0.1), rng.standard_normal(8)])
    ids = np.repeat([0, 1], 8)
    adv, _ = xent.group_advantages(r, ids)
    out, info = xent.batch_normalize(adv)
    assert np.all(out[:8].view(np.uint32) == 0) and not info["degenerate"]
    a64 = adv.astype(np.float64)
    scale = np.abs(a64).mean()
    close_f32(out, a64 / scale, np.abs(a64) / scale * 3, "mean_abs")


def test_batch_std_matches_float64(rng):
    a = (rng.standard_normal(50) * 2 + 1).astype(np.float32)
    mask = rng.random(50) < 0.7
    for std, ddof in (("population", 0), ("sample", 1)):
        out, info = xent.batch_normalize(a, mask, kind="std", std=std,
                                         subtract_mean=True, eps=1e-3)
        x = a[mask].astype(np.float64)
        ref = a.astype(np.float64).copy()
        ref[mask] = (x - x.mean()) / (x.std(ddof=ddof) + 1e-3)
        mag = np.where(mask, (np.abs(a) + abs(x.mean())) /
                       (x.std(ddof=ddof) + 1e-3) * 50, np.abs(a))
        close_f32(out, ref, mag, "batch std=%s" % std)
        assert np.array_equal(out[~mask].view(np.uint32),
                              a[~mask].view(np.uint32))
        assert info["n_counted"] == mask.sum()


def test_batch_bad_input_untouched():
    a = np.ones(6, np.float32)
    out = poison(6)
    raises_with(lambda: xent.batch_normalize(a, np.array([1, 1, 2, 1, 1, 1],
                                                         np.uint8), out=out),
                "[2]")
    raises_with(lambda: xent.batch_normalize(a, [1, 1, 1, 1, 5, 1],
                                             out=out), "mask[4] = 5")
    raises_with(lambda: xent.batch_normalize(a, np.ones(5, bool), out=out),
                "mask shape")
    raises_with(lambda: xent.batch_normalize(a, kind="max", out=out),
                "kind = 'max'")
    raises_with(lambda: xent.batch_normalize(a, eps=-1, out=out), "eps")
    assert untouched(out)


# ------------------------------------------------------------ policy losses

def ref_token_loss(loss, new, old, A, lo, hi, C=20.0):
    """float64 per-token loss and d/dnew of one of PPO / CISPO / REINFORCE
    (TIS and KL off)."""
    new = new.astype(np.float64)
    if loss == "reinforce":
        return -A * new, -A + 0 * new, np.abs(A * new)
    d = np.where(new == old, 0.0, new - old.astype(np.float64))
    lr = np.clip(d, -C, C)
    clamped = np.abs(d) > C
    r = np.exp(lr)
    c = np.clip(r, 1 - lo, 1 + hi)
    if loss == "cispo":
        return -c * A * new, -c * A, np.abs(c * A * new)
    unc, clp = -A * r, -A * c
    take_unc = unc >= clp
    l = np.where(take_unc, unc, clp)
    g = np.where(take_unc & ~clamped, -A * r, 0.0)
    return l, g, np.abs(l)


def away_from_kinks(rng, T, lo, hi):
    """new, old log-probs whose ratio is at least 1e-3 from 1-lo, 1+hi."""
    old = -rng.exponential(2.0, T).astype(np.float32)
    lr = rng.normal(0, 0.3, T)
    for edge in (1 - lo, 1 + hi):
        near = np.abs(np.exp(lr) - edge) < 1e-3
        lr[near] += 0.01
    new = np.minimum(old + lr, -1e-3).astype(np.float32)
    return new, old


@pytest.mark.parametrize("loss", ["ppo", "cispo", "reinforce"])
def test_policy_loss_matches_float64(rng, loss):
    T, lo, hi = 200, 0.2, 0.28
    new, old = away_from_kinks(rng, T, lo, hi)
    old[:3] = [-INF, -9999.0, -60.0]             # clamped tokens
    A = rng.standard_normal(T).astype(np.float32)
    A[:3] = -1.0
    mask = rng.random(T) < 0.9
    mask[:3] = True
    new[~mask] = np.nan                          # never read
    norm = 1000.0
    val, grad, st = xent.policy_loss(new, old, A, loss=loss, mask=mask,
                                     eps_low=lo, eps_high=hi,
                                     token_norm=norm)
    n_, o_, A_ = new[mask], old[mask], A[mask].astype(np.float64)
    l, g, mag = ref_token_loss(loss, n_, o_, A_, lo, hi)
    close_f32(st["token_loss"][mask], l, mag, loss + " token loss")
    close_f32(grad[mask], g / norm, np.abs(g) / norm, loss + " grad")
    assert np.all(st["token_loss"][~mask] == 0) and np.all(grad[~mask] == 0)
    close_sum(val, l.sum() / norm, np.abs(l).sum() / norm, loss + " loss")
    assert st["n_tokens"] == mask.sum() and np.isfinite(val)
    if loss != "reinforce":
        assert st["n_clamped"] >= 2


def test_dual_clip_and_kl_term_match_float64(rng):
    T, dual, coef = 150, 3.0, 0.1
    new, old = away_from_kinks(rng, T, 0.2, 0.2)
    old[:10] -= 4.0    # r = e^(4 + lr) > dual = 3 (lr ~ N(0, 0.3)): active
    # (a shift of 2 left a row inactive for 1.2% of seeds, lr < -0.9)
    ref = np.minimum(new + rng.normal(0, 0.5, T), 0).astype(np.float32)
    A = rng.standard_normal(T).astype(np.float32)
    A[:10] = -np.abs(A[:10]) - 0.1
    val, grad, st = xent.policy_loss(new, old, A, dual_clip=dual, kl="k3",
                                     kl_coef=coef, ref_logprobs=ref,
                                     token_norm=T)
    A64 = A.astype(np.float64)
    l, g, mag = ref_token_loss("ppo", new, old, A64, 0.2, 0.2)
    cap = -A64 * dual
    on = (A64 < 0) & (l > cap)
    l, g = np.where(on, cap, l), np.where(on, 0.0, g)
    d = ref.astype(np.float64) - new
    l = l + coef * (np.expm1(d) - d)
    g = g - coef * np.expm1(d)
    mag = mag + np.abs(cap) + coef * (np.abs(np.expm1(d)) + np.abs(d))
    close_f32(st["token_loss"], l, mag, "dual+kl loss")
    close_f32(grad, g / T, (np.abs(g) + coef * (np.exp(d) + 1)) / T,
              "dual+kl grad")
    close_sum(val, l.sum() / T, mag.sum() / T, "dual+kl total")
    assert st["n_dual_clip"] == int(on.sum()) >= 10


def test_keyword_defaults_are_the_c_defaults():
    import ctypes
    import inspect
    from xent import _capi as C
    o = C.RlLossOpts()
    C.LIB.fn("xent_rl_loss_opts_init")(ctypes.byref(o))
    p = inspect.signature(xent.policy_loss).parameters
    assert p["loss"].default == "ppo" and o.loss == 0
    for k in ("eps_low", "eps_high", "log_ratio_clamp", "tis_cap",
              "kl_coef", "zero_run_limit"):
        assert p[k].default == getattr(o, k), k
    for k in ("dual_clip", "token_norm", "seq_norm"):
        assert p[k].default is None and getattr(o, k) == 0, k
    assert (p["agg"].default, o.agg) == ("token_sum", 0)
    assert (p["tis"].default, o.tis, p["tis_mode"].default, o.tis_mode) == \
        (None, 0, "truncate", 0)
    assert (p["kl"].default, o.kl) == (None, 0)
    a = C.RlAdvOpts()
    C.LIB.fn("xent_rl_adv_opts_init")(ctypes.byref(a))
    p = inspect.signature(xent.group_advantages).parameters
    assert (p["std"].default, a.std) == ("population", 0)
    assert p["eps"].default == a.eps and p["subtract_mean"].default == \
        bool(a.subtract_mean)
    b = C.RlBatchOpts()
    C.LIB.fn("xent_rl_batch_opts_init")(ctypes.byref(b))
    p = inspect.signature(xent.batch_normalize).parameters
    assert (p["kind"].default, b.kind, p["std"].default, b.std) == \
        ("mean_abs", 0, "population", 0)
    assert p["eps"].default == b.eps and \
        p["subtract_mean"].default == bool(b.subtract_mean)


@pytest.mark.parametrize("old0", [-INF, -9999.0])
def test_stale_old_logprob_finite(old0):
    """Known failure (docs/rl.md): exp(new - old) with old = -inf and A < 0
    is +inf loss and NaN gradient; with the clamp at 20 it is e^20."""
    new = np.array([-1.0, -0.5], np.float32)
    old = np.array([old0, -0.5], np.float32)
    val, grad, st = xent.policy_loss(new, old, np.array([-1.0, -1.0]),
                                     token_norm=2)
    assert np.isfinite(val) and np.all(np.isfinite(grad))
    assert st["n_clamped"] == 1 and grad[0] == 0
    assert abs(val - (np.exp(20.0) + 1.0) / 2) <= 2.0 ** -40 * np.exp(20.0)


def test_tis_without_sampler_is_error():
    new = np.full(4, -1.0, np.float32)
    g = poison(4)
    msg = raises_with(lambda: xent.policy_loss(new, new, np.ones(4),
                                               token_norm=4, tis="token",
                                               grad_out=g),
                      "lp_sampler", "no fall-back", status=5)
    assert "NULL" in msg and untouched(g)
    val, _, st = xent.policy_loss(new, new, np.ones(4), token_norm=4,
                                  tis="token", sampler_logprobs=new - 0.5,
                                  grad_out=g)
    # w = min(e^0.5, 2) = 1.6487; PPO at r = 1: l = -A w
    assert abs(val + np.exp(0.5)) <= 2.0 ** -45 and st["n_tis_truncated"] == 0


def test_tis_token_truncate_matches_float64(rng):
    T, cap = 64, 1.5
    new, old = away_from_kinks(rng, T, 0.2, 0.2)
    smp = (old + rng.normal(0, 0.5, T)).astype(np.float32)
    smp = np.minimum(smp, 0).astype(np.float32)
    A = rng.standard_normal(T).astype(np.float32)
    val, grad, st = xent.policy_loss(new, old, A, tis="token", tis_cap=cap,
                                     sampler_logprobs=smp, token_norm=T)
    w = np.minimum(np.exp(old.astype(np.float64) - smp), cap)
    l, g, mag = ref_token_loss("ppo", new, old, A.astype(np.float64), .2, .2)
    close_f32(st["token_loss"], w * l, w * mag, "tis loss")
    close_f32(grad, w * g / T, np.abs(w * g) / T, "tis grad")
    assert st["n_tis_truncated"] == int(np.sum(np.exp(
        old.astype(np.float64) - smp) > cap))


def test_gspo_per_sequence_matches_float64(rng):
    lens = [5, 1, 9, 4]
    off = np.concatenate([[0], np.cumsum(lens)])
    T = off[-1]
    new, old = away_from_kinks(rng, T, 3e-3, 4e-3)
    A = rng.standard_normal(len(lens)).astype(np.float32)
    val, grad, st = xent.policy_loss(new, old, A, loss="gspo", offsets=off,
                                     eps_low=3e-3, eps_high=4e-3,
                                     agg="seq_mean_token_mean", seq_norm=8)
    ref_l, ref_g, total = np.empty(T), np.empty(T), 0.0
    for i, n in enumerate(lens):
        s = slice(off[i], off[i + 1])
        m = np.mean(new[s].astype(np.float64) - old[s])
        r = np.exp(m)
        a = float(A[i])
        c = min(max(r, 1 - 3e-3), 1 + 4e-3)
        unc = -a * r >= -a * c
        ref_l[s] = -a * r if unc else -a * c
        ref_g[s] = (-a * r if unc else 0.0) / (n * 8)
        total += ref_l[s].sum() / n / 8
    close_f32(st["token_loss"], ref_l, np.abs(ref_l) * 16, "gspo loss")
    close_f32(grad, ref_g, np.abs(ref_g) * 16, "gspo grad")
    close_sum(val, total, np.abs(ref_l).sum(), "gspo total")


def test_two_d_equals_offsets(rng):
    B, S = 3, 6
    new, old = away_from_kinks(rng, B * S, 0.2, 0.2)
    A = rng.standard_normal(B).astype(np.float32)
    v1, g1, _ = xent.policy_loss(new.reshape(B, S), old.reshape(B, S), A,
                                 agg="seq_mean_token_mean", seq_norm=B)
    v2, g2, _ = xent.policy_loss(new, old, A, offsets=[0, 6, 12, 18],
                                 agg="seq_mean_token_mean", seq_norm=B)
    assert g1.shape == (B, S) and v1 == v2
    assert np.array_equal(g1.reshape(-1), g2)


def test_zero_filled_sampler_dump_rejected():
    """Known failure (docs/rl.md): a missing sampler log-prob filled with 0 gives a ratio
    near 4.8e4; a run of 32 exact zeros is rejected with its position."""
    new = np.full(40, -0.7, np.float32)
    smp = new.copy()
    smp[5:40] = 0.0
    raises_with(lambda: xent.policy_loss(new, new, np.ones(40),
                                         token_norm=40, tis="token",
                                         sampler_logprobs=smp),
                "lp_sampler[5", "zero")
    rep = xent.check_logprobs(smp, raise_on_error=False)
    assert not rep["ok"] and rep["first_zero_run"] == 5
    assert rep["longest_zero_run"] == 35


def test_policy_loss_bad_input_untouched():
    new = np.full(6, -1.0, np.float32)
    old = new.copy()
    A = np.ones(6, np.float32)
    g = poison(6)

    def call(**kw):
        args = dict(new_logprobs=new, old_logprobs=old, advantages=A,
                    token_norm=6, grad_out=g)
        args.update(kw)
        return lambda: xent.policy_loss(**args)

    bad = old.copy()
    bad[3] = 0.25
    raises_with(call(old_logprobs=bad), "lp_old[3]", "> 0")
    bad = new.copy()
    bad[4] = -INF
    raises_with(call(new_logprobs=bad), "lp_new[4]", "-inf")
    badA = A.copy()
    badA[2] = np.nan
    raises_with(call(advantages=badA), "advantages[2]", "not finite")
    raises_with(call(old_logprobs=old[:5]), "old_logprobs shape")
    raises_with(call(token_norm=None), "token_norm")
    raises_with(call(loss="grpo"), "loss = 'grpo'")
    raises_with(call(old_logprobs=None), "lp_old is NULL")
    raises_with(call(offsets=[0, 3, 2, 6], advantages=np.ones(3)),
                "offsets[2]")
    raises_with(call(advantages=np.ones(4)), "advantages shape (4,)")
    raises_with(call(mask=np.array([1, 1, 1, 3, 1, 1], np.uint8)),
                "mask[3]")
    raises_with(call(log_ratio_clamp=100.0), "log_ratio_clamp")
    raises_with(call(advantages=np.ones(6), offsets=[0, 1, 2, 3, 4, 5, 6]),
                "adv_layout")
    assert untouched(g)
    xent.policy_loss(new, old, np.ones(6), offsets=[0, 1, 2, 3, 4, 5, 6],
                     adv_layout="sequence", token_norm=6, grad_out=g)
    assert np.all(g == np.float32(-1 / 6))   # r = 1: PPO grad -A r / 6


# ---------------------------------------------------- KL, diagnostics, checks

@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_matches_float64(rng, kind):
    new = -rng.exponential(1.0, 100).astype(np.float32)
    ref = (new + rng.normal(0, 1, 100)).astype(np.float32)
    ref = np.minimum(ref, 0).astype(np.float32)
    ref[0] = -INF
    k, dk, info = xent.kl(new, ref, kind=kind)
    d = np.clip(ref.astype(np.float64) - new, -20, 20)
    live = np.abs(ref.astype(np.float64) - new) <= 20   # clamped: dk = 0
    want, dwant = {"k1": (-d, np.ones_like(d)), "k2": (d * d / 2, -d),
                   "k3": (np.expm1(d) - d, -np.expm1(d))}[kind]
    mag = np.abs(want) + (np.abs(np.expm1(d)) + np.abs(d)
                          if kind == "k3" else 0)
    close_f32(k, want, mag, kind)
    close_f32(dk, dwant * live, np.abs(dwant) + 1, kind + " derivative")
    assert info["n_clamped"] == 1
    raises_with(lambda: xent.kl(new, ref, kind="k4"), "kind = 'k4'")


def test_diagnostics_match_float64(rng):
    T = 300
    new, old = away_from_kinks(rng, T, 0.2, 0.2)
    smp = np.minimum(old + rng.normal(0, 0.2, T), 0).astype(np.float32)
    d = xent.rl_diagnostics(new, old, smp)
    r = np.exp(new.astype(np.float64) - old)
    w = np.exp(old.astype(np.float64) - smp)
    assert d["n_tokens"] == T and d["has_weights"]
    assert d["clip_frac_low"] == np.mean(r < 0.8)
    assert d["clip_frac_high"] == np.mean(r > 1.2)
    for key, want in (("ratio_mean", r.mean()), ("ratio_max", r.max()),
                      ("ratio_min", r.min()),
                      ("ess_frac", w.sum() ** 2 / (T * (w * w).sum())),
                      ("chi2", np.mean((w - 1) ** 2)),
                      ("mismatch_kl_k1", np.mean(smp.astype(np.float64)
                                                 - old)),
                      ("mismatch_kl_k3", np.mean(w - 1 - np.log(w)))):
        close_sum(d[key], want, 4 * T * (np.abs(want) + r.max() + w.max()
                                         + 1), key)
    d0 = xent.rl_diagnostics(new)
    assert d0["ratio_mean"] == 0 and not d0["has_weights"]


def test_check_logprobs_report():
    lp = np.array([-1, 0.5, np.nan, -INF, -2, 0.5], np.float32)
    rep = xent.check_logprobs(lp, name="sampler", raise_on_error=False)
    assert (rep["n_nan"], rep["first_nan"]) == (1, 2)
    assert (rep["n_positive"], rep["first_positive"]) == (2, 1)
    assert (rep["n_neg_inf"], rep["first_neg_inf"]) == (1, 3)
    assert not rep["ok"] and "sampler[" in rep["message"]
    raises_with(lambda: xent.check_logprobs(lp, name="sampler"), "sampler[")
    rep = xent.check_logprobs(lp, mask=[1, 0, 0, 1, 1, 0],
                              allow_neg_inf=True)
    assert rep["ok"] and rep["n_checked"] == 3
    raises_with(lambda: xent.check_logprobs(np.arange(3)), "dtype int")


# ------------------------------------------------------------- torch (CPU)

def test_torch_cpu_policy_loss_backward(rng):
    torch = pytest.importorskip("torch")
    T = 32
    new, old = away_from_kinks(rng, T, 0.2, 0.2)
    A = rng.standard_normal(T).astype(np.float32)
    val_np, g_np, _ = xent.policy_loss(new, old, A, token_norm=T)
    tn = torch.tensor(new, requires_grad=True)
    loss, grad, st = xent.policy_loss(tn, torch.tensor(old), torch.tensor(A),
                                      token_norm=T)
    assert isinstance(loss, torch.Tensor) and loss.dtype == torch.float32
    assert float(loss.detach()) == np.float32(val_np)
    (2 * loss).backward()
    assert torch.equal(tn.grad, 2 * torch.from_numpy(g_np))
    assert torch.equal(grad, torch.from_numpy(g_np))


def test_torch_cpu_advantages_and_errors():
    torch = pytest.importorskip("torch")
    a, info = xent.group_advantages(torch.full((3, 7), 0.1))
    assert isinstance(a, torch.Tensor) and torch.all(a == 0)
    with pytest.raises(xent.XentError, match=r"\[4\]"):
        xent.group_advantages(torch.tensor([1., 2, 3, 4, float("nan")]),
                              torch.zeros(5, dtype=torch.int64))


def test_torch_cpu_every_function_equals_numpy(rng):
    torch = pytest.importorskip("torch")
    B, S = 4, 8
    new, old = away_from_kinks(rng, B * S, 0.2, 0.2)
    new, old = new.reshape(B, S), old.reshape(B, S)
    smp = np.minimum(old + 0.1, 0).astype(np.float32)
    mask = rng.random((B, S)) < 0.8
    t = torch.from_numpy
    r = rng.standard_normal((B, 4)).astype(np.float32)
    a_np, _ = xent.group_advantages(r, std="sample")
    a_t, _ = xent.group_advantages(t(r), std="sample")
    assert np.array_equal(a_t.numpy(), a_np)
    b_np, _ = xent.batch_normalize(new, mask)
    b_t, _ = xent.batch_normalize(t(new), t(mask))
    assert np.array_equal(b_t.numpy(), b_np)
    k_np = xent.kl(new, old, kind="k2", mask=mask)
    k_t = xent.kl(t(new), t(old), kind="k2", mask=t(mask))
    assert np.array_equal(k_t[0].numpy(), k_np[0])
    assert np.array_equal(k_t[1].numpy(), k_np[1])
    assert xent.rl_diagnostics(t(new), t(old), t(smp), mask=t(mask)) == \
        xent.rl_diagnostics(new, old, smp, mask=mask)
    assert xent.check_logprobs(t(new), mask=t(mask)) == \
        xent.check_logprobs(new, mask=mask)
    A = rng.standard_normal(B).astype(np.float32)
    kw = dict(loss="gspo", agg="seq_mean_token_mean", seq_norm=B,
              tis="sequence", tis_mode="mask", sampler_logprobs=smp)
    v_np, g_np, _ = xent.policy_loss(new, old, A, mask=mask, **kw)
    kw["sampler_logprobs"] = t(smp)
    v_t, g_t, _ = xent.policy_loss(t(new), t(old), t(A), mask=t(mask), **kw)
    assert float(v_t) == np.float32(v_np) and np.array_equal(g_t.numpy(),
                                                             g_np)
