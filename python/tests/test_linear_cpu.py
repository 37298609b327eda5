"""The fused LM head on the CPU (xent/_linear_cpu.py, issue 45):
xent.linear_cross_entropy / xent.linear_logprobs on CPU tensors against a
float64 torch reference computed from the same inputs (logits =
hidden.double() @ weight.double().T + bias), the fp32 weight-gradient
accumulation (grad_accum) and the vocabulary-parallel head over gloo.

Tolerances (derived; the measured values are printed with -s):

  Loss / log-probs / entropy. The fp32 logits of a chunk are dot products of
  length H: |dz_j| <= gamma_{H+1} S_j, S_j = sum_k |h_k w_jk| (+ |b_j|),
  gamma_n = n u / (1 - n u), u = 2^-24 (fp32 products are rounded once more
  than bf16 ones, hence H + 1). nll = lse - z_t and the log-prob move by at
  most 2 max_j |dz_j| (lse is 1-Lipschitz in the max norm); the entropy by
  at most 2 max_j |dz_j| max(1, |log p|)-weighted, which we bound by
  2 max |dz| (H_max + 1) with H_max = log V. On top: the kernel's faithful
  rounding (1 ulp of the value, docs/numerics.md). Reduced losses: the same
  per row, averaged.
  Gradients. dz is rounded once to fp32 (u relative per element) on top of
  the logits' error (which moves p_j by p_j 2 max|dz|); the products sum in
  fp32 (gamma_T / gamma_V worst case): relative norm error
  <= 2 max|dz| + gamma_max(T,V) + 2u, checked as REL_GRAD_F32 = 1e-5 at
  these shapes (T, V <= 400: gamma ~ 2.4e-5 worst case, a random walk
  ~ sqrt(400) u = 1.2e-6; measured ~3e-7). bf16 / f16 inputs: the gradients
  are returned rounded once to the dtype (2^-9 / 2^-12 relative per
  element), so 2^-8 / 2^-11 in norm.
"""
import datetime
import math
import os

import numpy as np
import pytest

try:
    import torch
except ImportError as e:
    pytest.skip("PyTorch is not importable (%s): the CPU fused LM head tests "
                "are skipped" % e, allow_module_level=True)

import xent  # noqa: E402

IGN = -100
U = 2.0 ** -24
REL_GRAD = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -8,
            torch.float16: 2.0 ** -11}


def tensors(rng, T, H, V, dtype=torch.float32, bias=False, spread=4.0,
            ignore_frac=0.15):
    s = math.sqrt(spread / math.sqrt(H))
    h = torch.from_numpy(rng.standard_normal((T, H)) * s).to(dtype)
    w = torch.from_numpy(rng.standard_normal((V, H)) * s).to(dtype)
    b = torch.from_numpy(rng.standard_normal(V)).to(dtype) if bias else None
    y = torch.from_numpy(rng.integers(0, V, size=T))
    y[torch.from_numpy(rng.random(T) < ignore_frac)] = IGN
    return h, w, b, y


def leaf(t, dtype=None):
    if t is None:
        return None
    t = t.detach().clone()
    return (t if dtype is None else t.to(dtype)).requires_grad_(True)


def ref_logits(h, w, b, temperature=1.0, softcap=0.0):
    z = h @ w.T
    if b is not None:
        z = z + b
    if softcap > 0:
        z = softcap * torch.tanh(z / softcap)
    return z / temperature


def ref_rows(z, y, z_loss=0.0, smoothing=0.0):
    valid = y != IGN
    logp = torch.log_softmax(z, -1)
    lse = torch.logsumexp(z, -1)
    nll = -logp.gather(1, y.clamp(min=0)[:, None])[:, 0]
    loss = (1 - smoothing) * nll + smoothing * (lse - z.mean(1)) + \
        z_loss * lse * lse
    return torch.where(valid, loss, torch.zeros_like(loss)), logp


def dz_bound(h, w, b):
    """max_j |dz_j| per row, worst case (see the docstring)."""
    H = h.shape[1] + 1
    g = H * U / (1 - H * U)
    m = h.double().abs() @ w.double().abs().T
    if b is not None:
        m = m + b.double().abs()
    return g * m.max(1).values


def ulp32(x):
    ax = np.abs(np.asarray(x, dtype=np.float64))
    e = np.floor(np.log2(np.where(ax > 0, ax, 1.0)))
    return np.exp2(np.maximum(e, -126) - 23)


def rel_norm(got, want):
    got, want = got.double(), want.double()
    assert torch.isfinite(got).all(), "non-finite gradient"
    n = want.norm().item()
    return (got - want).norm().item() / (n if n > 0 else 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias", [False, True])
def test_loss_and_grads_vs_float64(rng, dtype, reduction, bias):
    T, H, V = 45, 32, 257
    h, w, b, y = tensors(rng, T, H, V, dtype, bias)
    opts = dict(label_smoothing=0.1, z_loss=1e-3, temperature=0.8) \
        if reduction == "sum" else {}
    hl, wl, bl = leaf(h), leaf(w), leaf(b)
    loss = xent.linear_cross_entropy(hl, wl, y, bl, reduction=reduction,
                                     chunk_rows=7, **opts)
    gout = torch.from_numpy(rng.uniform(0.5, 1.5, size=loss.shape)).float()
    (loss * gout).sum().backward()
    h64, w64, b64 = leaf(h, torch.float64), leaf(w, torch.float64), \
        leaf(b, torch.float64)
    z = ref_logits(h64, w64, b64, opts.get("temperature", 1.0))
    rows, _ = ref_rows(z, y, opts.get("z_loss", 0.0),
                       opts.get("label_smoothing", 0.0))
    n = int((y != IGN).sum())
    ref = rows if reduction == "none" else rows.sum() / (
        n if reduction == "mean" else 1)
    (ref * gout.double()).sum().backward()
    # per-row bound: 2 max|dz| / temperature (+ the smoothing / z-loss
    # terms move with lse by the same amount, times (1 + 2 k |lse|))
    lse = torch.logsumexp(z, -1).detach()
    dz = dz_bound(h, w, b) / opts.get("temperature", 1.0)
    per_row = 2 * dz * (1 + 2 * opts.get("z_loss", 0.0) * lse.abs())
    per_row = torch.where(y != IGN, per_row, torch.zeros_like(per_row))
    if reduction == "none":
        tol = per_row.numpy() + ulp32(ref.detach().numpy())
    else:
        tol = per_row.sum().item() / (n if reduction == "mean" else 1) + \
            ulp32(ref.item())
    err = np.abs(loss.detach().double().numpy() - ref.detach().numpy())
    print("loss err %.3g (bound %.3g)" % (err.max(), np.max(tol)))
    assert np.all(err <= tol), (err.max(), np.max(tol))
    for name, got, want in (("hidden", hl, h64), ("weight", wl, w64),
                            ("bias", bl, b64)):
        if got is None:
            continue
        assert got.grad.dtype == dtype
        r = rel_norm(got.grad, want.grad)
        print("%s grad rel %.3g" % (name, r))
        assert r <= REL_GRAD[dtype], (name, r)


@pytest.mark.parametrize("temperature,softcap", [(1.0, 0.0), (0.7, 0.0),
                                                 (1.3, 3.0)])
def test_logprobs_entropy_grads_vs_float64(rng, temperature, softcap):
    """linear_logprobs(entropy=True) is differentiable in both outputs; the
    gradients of sum(a * logprob + c * entropy) match float64 autograd."""
    T, H, V = 40, 24, 301
    h, w, b, y = tensors(rng, T, H, V, bias=True)
    hl, wl, bl = leaf(h), leaf(w), leaf(b)
    lp, ent = xent.linear_logprobs(hl, wl, y, bl, temperature=temperature,
                                   softcap=softcap, entropy=True,
                                   chunk_rows=9)
    a = torch.from_numpy(rng.standard_normal(T)).float()
    c = torch.from_numpy(rng.standard_normal(T)).float()
    ((lp * a).sum() + (ent * c).sum()).backward()
    h64, w64, b64 = leaf(h, torch.float64), leaf(w, torch.float64), \
        leaf(b, torch.float64)
    z = ref_logits(h64, w64, b64, temperature, softcap)
    logp = torch.log_softmax(z, -1)
    e = -(logp.exp() * logp).sum(-1)
    lpr = torch.where(y != IGN, logp.gather(1, y.clamp(min=0)[:, None])[:, 0],
                      torch.zeros(T, dtype=torch.float64))
    ((lpr * a.double()).sum() + (e * c.double()).sum()).backward(
        retain_graph=True)
    dz = 2 * dz_bound(h, w, b).numpy() / temperature
    tol_lp = dz + ulp32(lpr.detach().numpy())
    tol_e = dz * (math.log(V) + 1) + ulp32(e.detach().numpy())
    err_lp = np.abs(lp.detach().double().numpy() - lpr.detach().numpy())
    err_e = np.abs(ent.detach().double().numpy() - e.detach().numpy())
    print("lp err %.3g, entropy err %.3g" % (err_lp.max(), err_e.max()))
    assert np.all(err_lp <= tol_lp) and np.all(err_e <= tol_e)
    assert torch.all(lp.detach()[y == IGN] == 0)
    for name, got, want in (("hidden", hl, h64), ("weight", wl, w64),
                            ("bias", bl, b64)):
        r = rel_norm(got.grad, want.grad)
        print("%s grad rel %.3g" % (name, r))
        assert r <= REL_GRAD[torch.float32], (name, r)
    # only the log-prob used: the kernel's path (no entropy term)
    hl.grad = None
    lp2 = xent.linear_logprobs(hl, wl.detach(), y, bl.detach(),
                               temperature=temperature, softcap=softcap)
    (lp2 * a).sum().backward()
    h64.grad = None
    (lpr * a.double()).sum().backward()
    assert rel_norm(hl.grad, h64.grad) <= REL_GRAD[torch.float32]


def test_dead_zone_row_keeps_gradient(rng):
    """A row whose target wins by ~60 nats: float32 log_softmax gives 0 and
    a zero target gradient; the fused head keeps both, to full relative
    accuracy (expm1 of the float64 nll)."""
    T, H, V = 4, 8, 50
    h, w, _, y = tensors(rng, T, H, V, ignore_frac=0.0)
    y[0] = 3
    w[3] = h[0] * (60.0 / float(h[0].pow(2).sum()))
    hl, wl = leaf(h), leaf(w)
    lp = xent.linear_logprobs(hl, wl, y)
    lp[0].backward()
    z = (h.double() @ w.double().T)[0]
    others = torch.cat([z[:3], z[4:]])
    nll = torch.log1p(torch.exp(others - z[3]).sum()).item()
    print("dead-zone nll %.6g, fused %.6g" % (nll, -lp[0].item()))
    # relative error of sum_j exp(z_j - z_t): exp(2 max|dz|) - 1
    rel = math.expm1(2 * dz_bound(h, w, None)[0].item()) + 2 * U
    assert lp[0].item() < 0 and abs(-lp[0].item() - nll) <= rel * nll
    g = wl.grad[3].double()
    want = -math.expm1(-nll) * h[0].double()
    assert rel_norm(g, want) <= rel + 2 * U


def test_chunk_sizes_agree(rng):
    """The loss is combined over all rows at once; only the logits' BLAS
    rounding may change with the chunk (a one-row chunk is a matrix-vector
    product): every chunking is within the bound of the exact loss, so two
    are within twice of it."""
    T, H, V = 50, 16, 129
    h, w, _, y = tensors(rng, T, H, V)
    outs = [xent.linear_cross_entropy(h, w, y, chunk_rows=c).item()
            for c in (0, 1, 7, 50)]
    n = int((y != IGN).sum())
    tol = 2 * (2 * dz_bound(h, w, None)[y != IGN].sum().item() / n +
               ulp32(outs[0]))
    assert all(abs(o - outs[0]) <= tol for o in outs), (outs, tol)


@pytest.mark.parametrize("mode", ["main_grad", "fp32_grad"])
def test_fp32_weight_grad_accumulation(rng, mode):
    """bf16 weight: dW of two micro-batches goes into an fp32 buffer, with no
    bf16 dW; equals the fp32 sum of the float64 gradients to fp32 accuracy
    (each micro-batch's gradient is not rounded to bf16)."""
    T, H, V = 30, 16, 97
    h, w, _, y = tensors(rng, T, H, V, torch.bfloat16)
    w = w.clone().requires_grad_(True)
    if mode == "main_grad":
        w.main_grad = torch.zeros(V, H)
    want = torch.zeros(V, H, dtype=torch.float64)
    for k in range(2):
        hk = h[k::2]
        yk = y[k::2]
        loss = xent.linear_cross_entropy(hk, w, yk, grad_accum=mode)
        loss.backward()
        w64 = w.detach().double().requires_grad_(True)
        z = hk.double() @ w64.T
        ref, _ = ref_rows(z, yk)
        (ref.sum() / int((yk != IGN).sum())).backward()
        want += w64.grad
    buf = w.main_grad if mode == "main_grad" else w.grad
    assert buf.dtype == torch.float32
    if mode == "main_grad":
        assert w.grad is None
    r = rel_norm(buf, want)
    print("%s rel %.3g" % (mode, r))
    assert r <= REL_GRAD[torch.float32]


def test_bad_inputs():
    h, w = torch.zeros(3, 4), torch.zeros(5, 4)
    y = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(xent.XentError, match="reduction"):
        xent.linear_cross_entropy(h, w, y, reduction="avg")
    with pytest.raises(xent.XentError, match="grad_accum"):
        xent.linear_cross_entropy(h, w, y, grad_accum="bf16")
    with pytest.raises(xent.XentError, match="weight shape"):
        xent.linear_cross_entropy(h, torch.zeros(5, 3), y)
    with pytest.raises(xent.XentError, match="labels shape"):
        xent.linear_cross_entropy(h, w, y[:2])
    with pytest.raises(xent.XentError, match="outside"):
        xent.linear_cross_entropy(h, w, torch.tensor([0, 5, 1]))
    with pytest.raises(xent.XentError, match="process_group"):
        xent.linear_cross_entropy(h, w, y, vocab_start=2)


# --- vocabulary parallel over gloo ------------------------------------------

TP_T, TP_H, TP_V, TP_BLOCK = 21, 12, 96, 8
TP_OPTS = [dict(reduction="mean"),
           dict(reduction="none", temperature=0.7, softcap=6.0)]


def tp_inputs(seed):
    rng = np.random.default_rng(seed)
    h, w, b, y = tensors(rng, TP_T, TP_H, TP_V, bias=True)
    return h, w, b, y


def _tp_worker(rank, init, seed, outdir):
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=init, rank=rank,
                            world_size=4,
                            timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    h, w, b, y = tp_inputs(seed)
    # every rank takes part in the creation of every group
    groups = {1: [dist.new_group([r]) for r in range(4)],
              2: [dist.new_group([0, 1]), dist.new_group([2, 3])],
              4: [dist.group.WORLD]}
    res = {}
    for deg in (1, 2, 4):
        g = groups[deg][rank // deg]
        r = rank % deg
        lo, hi = r * TP_V // deg, (r + 1) * TP_V // deg
        for blk in (None, TP_BLOCK):
            for k, o in enumerate(TP_OPTS):
                hl = h.clone().requires_grad_(True)
                wl = w[lo:hi].clone().requires_grad_(True)
                bl = b[lo:hi].clone().requires_grad_(True)
                loss = xent.linear_cross_entropy(
                    hl, wl, y, bl, process_group=g, vocab_start=lo,
                    vocab_block=blk, chunk_rows=8, **o)
                gout = torch.linspace(0.5, 1.5, loss.numel()) \
                    .reshape(loss.shape)
                (loss * gout).sum().backward()
                lp, ent = xent.linear_logprobs(
                    hl.detach().requires_grad_(True), wl.detach(), y,
                    bl.detach(), process_group=g, vocab_start=lo,
                    vocab_block=blk, entropy=True, temperature=0.9)
                res[(deg, blk, k)] = dict(
                    loss=loss.detach(), gh=hl.grad, gw=wl.grad, gb=bl.grad,
                    lo=lo, lp=lp.detach(), ent=ent.detach())
    torch.save(res, os.path.join(outdir, "tp_r%d.pt" % rank))
    dist.barrier()
    dist.destroy_process_group()


def test_vocab_parallel_gloo(tmp_path):
    """TP degrees 1, 2 and 4 (subgroups of one 4-process gloo job): loss,
    log-probs, entropy and every gradient equal the unsharded call within
    the bound; with vocab_block they are bitwise equal across degrees."""
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    import torch.multiprocessing as mp
    seed = int(np.random.default_rng().integers(1 << 30))
    print("tp seed", seed)
    init = "file://" + str(tmp_path / "rdv")
    mp.spawn(_tp_worker, args=(init, seed, str(tmp_path)), nprocs=4,
             join=True)
    parts = [torch.load(str(tmp_path / ("tp_r%d.pt" % r)))
             for r in range(4)]
    h, w, b, y = tp_inputs(seed)
    for k, o in enumerate(TP_OPTS):
        hl, wl, bl = leaf(h), leaf(w), leaf(b)
        loss = xent.linear_cross_entropy(hl, wl, y, bl, **o)
        gout = torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape)
        (loss * gout).sum().backward()
        want = dict(loss=loss.detach(), gh=hl.grad, gw=wl.grad, gb=bl.grad)
        for blk in (None, TP_BLOCK):
            per_deg = {}
            for deg in (1, 2, 4):
                # rank 0's view of degree deg: its loss and dhidden, and the
                # weight / bias gradients of ranks 0..deg-1 concatenated
                got = parts[0][(deg, blk, k)]
                gw = torch.cat([parts[r][(deg, blk, k)]["gw"]
                                for r in range(deg)])
                gb = torch.cat([parts[r][(deg, blk, k)]["gb"]
                                for r in range(deg)])
                per_deg[deg] = (got["loss"], got["gh"], gw, gb, got["lp"],
                                got["ent"])
                # every rank of the group has the same loss and dhidden
                for r in range(deg):
                    assert torch.equal(parts[r][(deg, blk, k)]["loss"],
                                       got["loss"])
                    assert torch.equal(parts[r][(deg, blk, k)]["gh"],
                                       got["gh"])
                tol = 4 * ulp32(want["loss"].numpy()) + 1e-6
                assert np.all(np.abs(got["loss"].double().numpy() -
                                     want["loss"].double().numpy()) <= tol)
                for name, g_ in (("gh", got["gh"]), ("gw", gw), ("gb", gb)):
                    assert rel_norm(g_, want[name]) <= REL_GRAD[
                        torch.float32], (deg, blk, k, name)
            if blk is not None:
                for deg in (2, 4):
                    for a, c in zip(per_deg[1], per_deg[deg]):
                        assert torch.equal(a, c), (deg, k)
