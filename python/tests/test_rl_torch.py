"""xent.rl in torch (issue 45): the C policy loss as an autograd node on the
fused head's outputs, against float64 torch formulas of docs/rl.md.

Bound: the C loss is a float64 computation rounded to float32 (the loss to
1 ulp plus float64 error; each per-token gradient is a float32 rounding of a
double: 2^-24 relative); the float64 torch reference differs from the exact
value by ~2^-50. Loss: 2 ulp(float32) + 1e-12; gradients: 2^-23 relative
per element. Through the fused head (float32 logits: see test_linear_cpu.py)
the hidden / weight gradients are checked to 1e-5 relative in norm.
"""
import inspect
import math
import types

import pytest

try:
    import torch
except ImportError as e:
    pytest.skip("PyTorch is not importable (%s): the torch RL tests are "
                "skipped" % e, allow_module_level=True)

import xent  # noqa: E402
import xent.rl as XR  # noqa: E402


def ref_ppo(new, old, adv, mask, *, eps_low=0.2, eps_high=0.2, clamp=20.0,
            sampler=None, tis_cap=2.0, ref=None, kl_coef=0.0,
            token_norm=1.0, seq_mean=False):
    """float64 PPO per docs/rl.md (per-sequence advantages [B], [B, L]
    tensors), token TIS (truncate, trainer side = old), K3 KL."""
    lr = (new - old).clamp(-clamp, clamp)
    r = lr.exp()
    A = adv[:, None]
    c = r.clamp(1 - eps_low, 1 + eps_high)
    # clamped log-ratios carry no gradient (the clamp does that)
    tok = torch.maximum(-A * r, -A * c)
    if sampler is not None:
        w = (old - sampler).clamp(-clamp, clamp).exp().clamp(max=tis_cap)
        tok = tok * w
    if ref is not None:
        d = (ref - new).clamp(-clamp, clamp)
        tok = tok + kl_coef * (d.exp() - 1 - d)
    tok = tok * mask
    if seq_mean:
        n = mask.sum(1).clamp(min=1)
        return ((tok.sum(1) / n).sum()) / new.shape[0]
    return tok.sum() / token_norm


def data(rng, B=3, L=7):
    new = torch.from_numpy(-rng.uniform(0.05, 3, (B, L)))
    old = new + torch.from_numpy(rng.normal(0, 0.3, (B, L)))
    old = old.clamp(max=-1e-3)
    sampler = old + torch.from_numpy(rng.normal(0, 0.5, (B, L)))
    sampler = sampler.clamp(max=-1e-3)
    ref = new + torch.from_numpy(rng.normal(0, 0.2, (B, L)))
    ref = ref.clamp(max=-1e-3)
    adv = torch.from_numpy(rng.normal(0, 1, B))
    mask = torch.from_numpy(rng.random((B, L)) < 0.8)
    return new, old, sampler, ref, adv, mask


def test_defaults_match_the_c_library():
    sig = inspect.signature(xent.policy_loss)
    from xent import _rl
    o = _rl._loss_opts()
    assert sig.parameters["eps_low"].default == o.eps_low == 0.2
    assert sig.parameters["eps_high"].default == o.eps_high == 0.2
    assert sig.parameters["log_ratio_clamp"].default == \
        o.log_ratio_clamp == 20.0
    assert sig.parameters["tis_cap"].default == o.tis_cap == 2.0


@pytest.mark.parametrize("case", ["ppo", "tis_kl", "clip_higher_seq"])
def test_policy_loss_grad_vs_float64(rng, case):
    new, old, sampler, ref, adv, mask = data(rng)
    kw, rkw = {}, {}
    ntok = float(mask.sum())
    if case == "tis_kl":
        kw = dict(sampler_logprobs=sampler.float(), tis="token",
                  ref_logprobs=ref.float(), kl="k3", kl_coef=0.05)
        rkw = dict(sampler=sampler.float().double(),
                   ref=ref.float().double(), kl_coef=0.05)
    if case == "clip_higher_seq":
        kw = dict(eps_high=0.28, agg="seq_mean_token_mean", seq_norm=3)
        rkw = dict(eps_high=0.28, seq_mean=True)
    else:
        kw["token_norm"] = ntok
        rkw["token_norm"] = ntok
    x = new.float().requires_grad_(True)
    loss, st = XR.policy_loss(x, old.float(), adv.float(), mask=mask, **kw)
    g = torch.linspace(0.5, 2.0, 1)[0]
    (loss * g).backward()
    x64 = new.float().double().requires_grad_(True)
    want = ref_ppo(x64, old.float().double(), adv.float().double(),
                   mask.double(), **rkw)
    (want * g.double()).backward()
    tol = 2 * 2.0 ** -23 * abs(want.item()) + 1e-12
    print(case, loss.item(), want.item(), st["clip_frac"],
          st["tis_clip_frac"])
    assert abs(loss.item() - want.item()) <= tol
    err = (x.grad.double() - x64.grad).abs()
    assert torch.all(err <= 2.0 ** -22 * x64.grad.abs() + 1e-30), err.max()
    assert 0 <= st["clip_frac"] <= 1 and 0 <= st["tis_clip_frac"] <= 1


def test_fused_head_to_policy_loss_with_entropy(rng):
    """linear_logprobs(entropy=True) -> policy_loss(entropy_coef) ->
    backward into hidden and weight, against the float64 chain."""
    B, L, H, V = 2, 6, 16, 61
    h = torch.from_numpy(rng.standard_normal((B, L, H)) * 0.6).float()
    w = torch.from_numpy(rng.standard_normal((V, H)) * 0.6).float()
    y = torch.from_numpy(rng.integers(0, V, (B, L)))
    mask = torch.from_numpy(rng.random((B, L)) < 0.85)
    adv = torch.from_numpy(rng.normal(0, 1, B)).float()
    tau, coef = 0.9, 0.01
    with torch.no_grad():
        old = xent.linear_logprobs(h, w, y, temperature=tau) + \
            torch.from_numpy(rng.normal(0, 0.1, (B, L))).float()
        old = old.clamp(max=-1e-4)
    hl, wl = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    lp, ent = xent.linear_logprobs(hl, wl, y, temperature=tau, entropy=True)
    ntok = float(mask.sum())
    loss, st = XR.policy_loss(lp, old, adv, mask=mask, token_norm=ntok,
                              entropy=ent, entropy_coef=coef)
    loss.backward()
    h64, w64 = h.double().requires_grad_(True), w.double().requires_grad_(True)
    logp = torch.log_softmax((h64 @ w64.T) / tau, -1)
    lp64 = logp.gather(-1, y[..., None])[..., 0]
    ent64 = -(logp.exp() * logp).sum(-1)
    want = ref_ppo(lp64, old.double(), adv.double(), mask.double(),
                   token_norm=ntok) - coef * (ent64 * mask).sum() / ntok
    want.backward()
    print("loss %.9g vs %.9g" % (loss.item(), want.item()))
    assert abs(loss.item() - want.item()) <= 1e-5 * max(1, abs(want.item()))
    for got, ref in ((hl.grad, h64.grad), (wl.grad, w64.grad)):
        r = ((got.double() - ref).norm() / ref.norm()).item()
        print("grad rel %.3g" % r)
        assert r <= 1e-5


def test_trl_and_verl_adapters(rng):
    new, old, sampler, ref, adv, mask = data(rng)
    new, old, adv = new.float(), old.float(), adv.float()
    ntok = float(mask.sum())
    base = ref_ppo(new.double(), old.double(), adv.double(), mask.double(),
                   token_norm=1.0)
    for loss_type, norm in (("bnpo", ntok), ("dapo", 50.0),
                            ("dr_grpo", 3 * 10)):
        loss, _ = XR.trl_loss(new, old, adv, mask.long(),
                              loss_type=loss_type, num_items_in_batch=50,
                              max_completion_length=10)
        assert abs(loss.item() - base.item() / norm) <= \
            2 * 2.0 ** -23 * abs(base.item() / norm) + 1e-12, loss_type
    loss, _ = XR.trl_loss(new, old, adv, mask, loss_type="grpo")
    want = ref_ppo(new.double(), old.double(), adv.double(), mask.double(),
                   seq_mean=True)
    assert abs(loss.item() - want.item()) <= 1e-6 * abs(want.item()) + 1e-12
    cfg = types.SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None,
                                clip_ratio_high=0.28, clip_ratio_c=3.0)
    x = new.clone().requires_grad_(True)
    loss, m = XR.verl_policy_loss(old, x, adv[:, None].expand_as(new)
                                  .contiguous(), mask.float(),
                                  "token-mean", cfg)
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert set(m) >= {"actor/pg_clipfrac", "actor/ppo_kl"}
    assert math.isfinite(loss.item())
