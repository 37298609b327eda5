"""The chunked fused LM head on CUDA (xent/_linear_cpu.py with the CUDA
kernels xent_cuda_ce_shard_stats / _combine / _backward, routed from
xent/_linear.py): differentiable linear_logprobs (entropy and temperature
gradients), grad_accum and the vocabulary-blocked path, against a float64
torch autograd reference and against the CPU path on the same inputs.
Needs a GPU and a libxent built with CUDA; skipped otherwise.

Bounds: fp32 inputs, so the logits are fp32 products (error ~ sqrt(H) u
times the row's magnitude); log-probs and entropy 1e-5 absolute (nats),
gradients 1e-5 relative in norm (the CPU test's bound; the CUDA kernels'
fp32 gradients are computed in double like the CPU's, docs/cuda.md);
bf16 inputs 2^-8 relative (one rounding to bf16 of the hidden gradient).
"""
import math

import numpy as np
import pytest

try:
    import torch
except ImportError as e:  # pragma: no cover
    pytest.skip("PyTorch is not importable (%s): the CUDA chunked head "
                "tests need torch" % e, allow_module_level=True)

import xent  # noqa: E402
from xent import _torch  # noqa: E402

GPU = _torch.cuda_available()
pytestmark = pytest.mark.skipif(not GPU, reason="no GPU, or libxent "
                                "without CUDA kernels")
IGN = -100
REL = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -8}


def tensors(seed, T, H, V, dtype=torch.float32, bias=False):
    rng = np.random.default_rng(seed)
    s = math.sqrt(4.0 / math.sqrt(H))
    h = torch.from_numpy(rng.standard_normal((T, H)) * s).to(dtype)
    w = torch.from_numpy(rng.standard_normal((V, H)) * s).to(dtype)
    b = torch.from_numpy(rng.standard_normal(V)).to(dtype) if bias else None
    y = torch.from_numpy(rng.integers(0, V, size=T))
    y[torch.from_numpy(rng.random(T) < 0.15)] = IGN
    return h, w, b, y


def leaf(t, dev="cuda", dtype=None):
    if t is None:
        return None
    t = t.detach().clone().to(dev)
    return (t if dtype is None else t.to(dtype)).requires_grad_(True)


def rel_norm(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    assert torch.isfinite(got).all()
    n = want.norm().item()
    return (got - want).norm().item() / (n if n > 0 else 1.0)


def ref_lp(h, w, b, y, temperature, softcap):
    z = h @ w.T
    if b is not None:
        z = z + b
    if softcap > 0:
        z = softcap * torch.tanh(z / softcap)
    z = z / temperature
    logp = torch.log_softmax(z, -1)
    lp = logp.gather(1, y.clamp(min=0)[:, None])[:, 0]
    lp = torch.where(y != IGN, lp, torch.zeros_like(lp))
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature,softcap", [(1.0, 0.0), (0.7, 0.0),
                                                 (0.8, 5.0)])
def test_logprobs_entropy_grads(dtype, temperature, softcap):
    T, H, V = 37, 24, 300
    h, w, b, y = tensors(1, T, H, V, dtype, bias=True)
    rng = np.random.default_rng(2)
    ga = torch.from_numpy(rng.standard_normal(T)).float()
    ge = torch.from_numpy(rng.standard_normal(T)).float()
    got, cpu = {}, {}
    for dev, out in (("cuda", got), ("cpu", cpu)):
        hx, wx, bx = leaf(h, dev), leaf(w, dev), leaf(b, dev)
        lp, ent = xent.linear_logprobs(hx, wx, y.to(dev), bx,
                                       temperature=temperature,
                                       softcap=softcap, entropy=True,
                                       chunk_rows=16)
        ((lp * ga.to(dev)).sum() + (ent * ge.to(dev)).sum()).backward()
        out.update(lp=lp.detach().cpu(), ent=ent.detach().cpu(),
                   h=hx.grad, w=wx.grad, b=bx.grad)
    hd, wd, bd = (leaf(t, "cpu", torch.float64) for t in (h, w, b))
    lp, ent = ref_lp(hd, wd, bd, y, temperature, softcap)
    ((lp * ga.double()).sum() + (ent * ge.double()).sum()).backward()
    assert (got["lp"].double() - lp.detach()).abs().max() < 1e-5
    assert (got["ent"].double() - ent.detach()).abs().max() < 1e-5
    assert (got["lp"] - cpu["lp"]).abs().max() < 1e-5
    for k, want in (("h", hd.grad), ("w", wd.grad), ("b", bd.grad)):
        r = rel_norm(got[k], want)
        rc = rel_norm(got[k], cpu[k].double())
        print("%s T=%.2f cap=%g d%s: vs float64 %.2e, vs CPU %.2e"
              % (dtype, temperature, softcap, k, r, rc))
        assert r <= REL[dtype] and rc <= 2 * REL[dtype], (k, r, rc)


@pytest.mark.parametrize("mode", ["main_grad", "fp32_grad"])
def test_grad_accum(mode):
    T, H, V = 50, 16, 200
    # fp32_grad on a bf16 weight needs Tensor.grad_dtype (newer torch)
    h, w, _, y = tensors(3, T, H, V, torch.bfloat16 if mode == "main_grad"
                         else torch.float32)
    wd = leaf(w, "cpu", torch.float64)
    want = torch.zeros_like(wd)
    wx = leaf(w)
    for k in range(2):                      # two micro-batches
        hk = h[k * 25:(k + 1) * 25].cuda()
        yk = y[k * 25:(k + 1) * 25].cuda()
        xent.linear_cross_entropy(hk, wx, yk, grad_accum=mode).backward()
        z = h[k * 25:(k + 1) * 25].double() @ wd.T
        g, = torch.autograd.grad(torch.nn.functional.cross_entropy(
            z, y[k * 25:(k + 1) * 25], ignore_index=IGN), wd)
        want += g
    buf = wx.main_grad if mode == "main_grad" else wx.grad
    assert buf.dtype == torch.float32 and buf.device.type == "cuda"
    if mode == "main_grad":
        assert wx.grad is None
    r = rel_norm(buf, want)
    print("%s rel %.3g" % (mode, r))
    assert r <= 1e-5


def test_blocked_path_equals_one_call_and_cpu():
    """vocab_block forces the chunked path: loss and gradients equal the
    one-call CUDA head's and the CPU head's within the fp32 bound."""
    T, H, V = 64, 32, 1000
    h, w, b, y = tensors(4, T, H, V, bias=True)
    res = {}
    for name, dev, kw in (("chunked", "cuda", dict(vocab_block=128)),
                          ("one", "cuda", {}),
                          ("cpu", "cpu", dict(vocab_block=128))):
        hx, wx, bx = leaf(h, dev), leaf(w, dev), leaf(b, dev)
        loss = xent.linear_cross_entropy(hx, wx, y.to(dev), bx,
                                         temperature=0.9, **kw)
        loss.backward()
        res[name] = (loss.item(), hx.grad, wx.grad, bx.grad)
    for other in ("one", "cpu"):
        a, o = res["chunked"], res[other]
        assert abs(a[0] - o[0]) <= 1e-5 * abs(o[0])
        for ga, go in zip(a[1:], o[1:]):
            assert rel_norm(ga, go.double()) <= 1e-5


def test_autocast_keeps_fp32_and_bad_label():
    T, H, V = 8, 16, 50
    h, w, _, y = tensors(5, T, H, V)
    hx, wx = leaf(h), leaf(w)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        lp = xent.linear_logprobs(hx, wx, y.cuda())
    want = xent.linear_logprobs(h, w, y)
    assert (lp.detach().cpu() - want).abs().max() < 1e-5
    y2 = y.clone()
    y2[2] = V
    with pytest.raises(xent.XentError, match=r"labels\[2\]"):
        xent.linear_logprobs(hx, wx, y2.cuda())
