"""The LM head fused with the cross-entropy (xent.linear_cross_entropy,
xent.linear_logprobs) against a float64 torch reference computed from the
same bf16 / f16 / f32 hidden, weight and bias: logits = hidden.double() @
weight.double().T (+ bias). Needs torch, a GPU and a libxent with
xent_cuda_linear_ce; otherwise the GPU tests are skipped.

Tolerances (measured values are printed; run with -s to see them):

  Loss. Each fp32 logit is a length-H dot product of exact products of
  bf16 values, accumulated in fp32: |dz| <= gamma_H * sum_k |h_k w_jk| with
  gamma_H = H u / (1 - H u), u = 2^-24 (worst case; a random walk gives
  about sqrt(H) u times the RMS term). nll = log1p(sum_{j != t}
  exp(z_j - z_t)), so its relative error is at most 2 max_j |dz_j| (plus
  the loss kernel's 3 fp32 ulp). The worst-case bound is printed; it is
  above the requirement of issue 9 (per-token NLL within 1e-5 relative of
  the fp64 reference), which is what is tested (REL_LOSS): it is tighter
  than the worst case and more than 10x the random-walk estimate at these
  shapes (H = 96..256: sqrt(H) u * 4 nats spread ~ 4e-6 absolute at most,
  against nll >= ~1 on random rows; the dead-zone row's relative error is
  the same max |dz| in nats).

  Gradients. dlogits are rounded once to the input dtype (relative error
  <= u_d = 2^-8 for bf16, 2^-11 for f16, 2^-24 for f32), the products
  accumulate in fp32 and the result is rounded once more (<= u_d): the
  error is about 2 u_d relative per element, so the relative RMS of the
  gradient error is about 2 u_d / sqrt(3) (uniform rounding errors):
  4.5e-3 for bf16. Issue 9 asks for <= 1e-2 relative RMS for bf16;
  f16 gets the same ratio scaled by its unit roundoff (1e-2 / 8); f32 is
  dominated by the fp32 sums (gamma_V, gamma_T ~ 1000 u = 6e-5 worst
  case): 1e-4.
"""
import math

import pytest

try:
    import torch
except ImportError as e:
    pytest.skip("PyTorch is not importable (%s): the fused LM head tests "
                "are skipped" % e, allow_module_level=True)

import xent  # noqa: E402
from xent import _linear  # noqa: E402

IGN = -100
DEV = "cuda"
GPU = _linear.available()
need_gpu = pytest.mark.skipif(
    not GPU, reason="no GPU, or libxent without CUDA or without "
    "xent_cuda_linear_ce")

REL_LOSS = 1e-5                                   # issue 9, see above
REL_GRAD = {torch.bfloat16: 1e-2, torch.float16: 1e-2 / 8,
            torch.float32: 1e-4}


def tensors(rng, T, H, V, dtype, ignore_frac=0.1, bias=False, spread=4.0):
    """hidden [T, H], weight [V, H] (logit standard deviation ~ spread),
    bias [V] or None, labels [T] int64 with ~ignore_frac ignored; on the
    GPU in `dtype`."""
    s = math.sqrt(spread / math.sqrt(H))
    h = torch.from_numpy(rng.standard_normal((T, H)) * s).to(dtype)
    w = torch.from_numpy(rng.standard_normal((V, H)) * s).to(dtype)
    b = torch.from_numpy(rng.standard_normal(V)).to(dtype) if bias else None
    y = torch.from_numpy(rng.integers(0, V, size=T))
    y[torch.from_numpy(rng.random(T) < ignore_frac)] = IGN
    dev = DEV
    return (h.to(dev), w.to(dev), None if b is None else b.to(dev),
            y.to(dev))


def leaf(t):
    return None if t is None else t.detach().clone().requires_grad_(True)


def ref_rows(h, w, b, y, temperature=1.0, softcap=0.0, z_loss=0.0,
             smoothing=0.0):
    """Per-row loss in float64 from the same inputs (differentiable in the
    float64 leaves h, w, b); nll in the log1p form, accurate to float64
    relative precision even on dead-zone rows (lse - z_t would cancel)."""
    z = h @ w.T
    if b is not None:
        z = z + b
    if softcap > 0:
        z = softcap * torch.tanh(z / softcap)
    z = z / temperature
    valid = y != IGN
    yc = y.clamp(min=0)
    zt = z.gather(1, yc[:, None])
    tgt = torch.zeros_like(z, dtype=torch.bool)
    tgt[torch.arange(len(y), device=y.device), yc] = True
    d = torch.where(tgt, torch.full_like(z, -math.inf), z - zt)
    nll = torch.log1p(d.exp().sum(1))
    lse = zt[:, 0] + nll
    loss = ((1 - smoothing) * nll + smoothing * (lse - z.mean(1))
            + z_loss * lse * lse)
    return torch.where(valid, loss, torch.zeros_like(loss)), nll, lse, z


def worst_nll_err(h, w, b):
    """2 gamma_H max_j sum_k |h_k w_jk| per row (nats), see the docstring;
    the bias adds one rounding of the sum (u |b| + u |z|)."""
    H = h.shape[1]
    u = 2.0 ** -24
    g = H * u / (1 - H * u)
    m = (h.double().abs() @ w.double().abs().T)
    if b is not None:
        m = m + u * (m + b.double().abs())
    return 2 * g * m.max(1).values


def poison_cache(*nbytes):
    """Best effort: fills blocks of these sizes with 0xFF (NaN in every
    float format) and frees them, so that torch's caching allocator hands
    them to the binding's next allocations of the same sizes; an output the
    library does not write then stays NaN and fails the checks."""
    ts = [torch.full((n,), 0xFF, dtype=torch.uint8, device=DEV)
          for n in nbytes if n > 0]
    del ts


def rel(a, b):
    a, b = float(a.detach()), float(b.detach())
    return abs(a - b) / abs(b)


def rel_rms(got, want):
    got, want = got.double(), want.double()
    assert torch.isfinite(got).all(), "non-finite gradient"
    return ((got - want).norm() / want.norm()).item()


def poison_for(T, H, V, dtype, bias):
    es = torch.tensor([], dtype=dtype).element_size()
    poison_cache(4, 4 * T, T * H * es, V * H * es, V * es if bias else 0)


# --- runs everywhere ---------------------------------------------------------


def test_cpu_tensors_take_the_cpu_path():
    """CPU tensors go to xent/_linear_cpu.py (tests/test_linear_cpu.py);
    the CUDA module itself still refuses them."""
    h, w = torch.zeros(3, 4), torch.zeros(5, 4)
    y = torch.zeros(3, dtype=torch.int64)
    assert abs(xent.linear_cross_entropy(h, w, y).item() - math.log(5)) \
        < 1e-6
    with pytest.raises(xent.XentTypeError, match="needs CUDA tensors"):
        _linear.linear_cross_entropy(h, w, y)
    with pytest.raises(xent.XentTypeError, match="needs CUDA tensors"):
        _linear.linear_logprobs(h, w, y)
    with pytest.raises(xent.XentError, match="reduction"):
        xent.linear_cross_entropy(h, w, y, reduction="avg")


# --- GPU -------------------------------------------------------------------


@need_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16,
                                   torch.float32])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("bias", [False, True])
def test_loss_and_grads_vs_float64(rng, dtype, reduction, bias):
    T, H, V = 67, 96, 1000
    h, w, b, y = tensors(rng, T, H, V, dtype, bias=bias)
    hx, wx, bx = leaf(h), leaf(w), leaf(b)
    poison_for(T, H, V, dtype, bias)
    loss = xent.linear_cross_entropy(hx, wx, y, bx, reduction=reduction)
    assert loss.dtype == torch.float32 and loss.shape == ()
    loss.backward()
    hd, wd, bd = leaf(h.double()), leaf(w.double()), leaf(
        None if b is None else b.double())
    rows, nll, _, _ = ref_rows(hd, wd, bd, y)
    ref = rows.sum() / ((y != IGN).sum() if reduction == "mean" else 1)
    ref.backward()
    e = rel(loss, ref)
    worst = (worst_nll_err(h, w, b) / nll.detach())[y != IGN].max().item()
    gh, gw = rel_rms(hx.grad, hd.grad), rel_rms(wx.grad, wd.grad)
    gb = rel_rms(bx.grad, bd.grad) if bias else 0.0
    print("%s %s bias=%s: loss rel %.2e (worst-case per-row bound %.2e), "
          "grad rel "
          "RMS hidden %.2e weight %.2e bias %.2e (tol %.0e)"
          % (dtype, reduction, bias, e,
             worst, gh, gw, gb,
             REL_GRAD[dtype]))
    tol = REL_GRAD[dtype]
    assert math.isfinite(loss.item()) and e <= REL_LOSS, (loss.item(), e)
    assert hx.grad.dtype == dtype and wx.grad.dtype == dtype
    assert gh <= tol and gw <= tol, (gh, gw, tol)
    if bias:
        assert bx.grad.dtype == dtype and gb <= tol, (gb, tol)


@need_gpu
@pytest.mark.parametrize("bias", [False, True])
def test_reduction_none_backward(rng, bias):
    """Per-row losses; the backward (xent_cuda_linear_backward from the
    saved stats) with a random upstream gradient."""
    T, H, V = 50, 128, 2003
    dtype = torch.bfloat16
    h, w, b, y = tensors(rng, T, H, V, dtype, bias=bias)
    h3 = h.view(5, 10, H)                       # leading dimensions kept
    hx, wx, bx = leaf(h3), leaf(w), leaf(b)
    poison_for(T, H, V, dtype, bias)
    loss = xent.linear_cross_entropy(hx, wx, y.view(5, 10), bx,
                                     reduction="none")
    assert loss.shape == (5, 10) and loss.dtype == torch.float32
    # fp32-exact upstream weights, so both sides use the same values
    g = torch.from_numpy(rng.standard_normal(T)).float().to(DEV)
    poison_for(T, H, V, dtype, bias)
    loss.backward(g.view(5, 10))
    hd, wd, bd = leaf(h.double()), leaf(w.double()), leaf(
        None if b is None else b.double())
    rows, nll, _, _ = ref_rows(hd, wd, bd, y)
    (rows * g.double()).sum().backward()
    got = loss.detach().reshape(-1).double()
    assert torch.isfinite(got).all()
    valid = y != IGN
    assert torch.all(got[~valid] == 0)
    e = ((got - rows.detach()).abs() / rows.detach().abs())[valid].max()
    gh = rel_rms(hx.grad.reshape(T, H), hd.grad)
    gw = rel_rms(wx.grad, wd.grad)
    gb = rel_rms(bx.grad, bd.grad) if bias else 0.0
    print("none bias=%s: per-row loss max rel %.2e, grad rel RMS hidden "
          "%.2e weight %.2e bias %.2e" % (bias, e.item(), gh, gw, gb))
    assert e.item() <= REL_LOSS, e.item()
    assert hx.grad.shape == (5, 10, H)
    assert gh <= REL_GRAD[dtype] and gw <= REL_GRAD[dtype], (gh, gw)
    if bias:
        assert gb <= REL_GRAD[dtype], gb


@need_gpu
def test_options_vs_float64(rng):
    """temperature, softcap, z-loss, label smoothing and a normalizer, all
    at once (the reference applies them in float64 as in include/xent.h)."""
    T, H, V = 40, 64, 777
    dtype = torch.bfloat16
    opts = dict(temperature=0.7, softcap=15.0, z_loss=1e-3,
                label_smoothing=0.1)
    h, w, b, y = tensors(rng, T, H, V, dtype, bias=True)
    hx, wx, bx = leaf(h), leaf(w), leaf(b)
    loss = xent.linear_cross_entropy(hx, wx, y, bx, normalizer=123.0,
                                     **opts)
    loss.backward()
    hd, wd, bd = leaf(h.double()), leaf(w.double()), leaf(b.double())
    rows, _, _, _ = ref_rows(hd, wd, bd, y, temperature=0.7, softcap=15.0,
                             z_loss=1e-3, smoothing=0.1)
    ref = rows.sum() / 123.0
    ref.backward()
    e = rel(loss, ref)
    gh, gw = rel_rms(hx.grad, hd.grad), rel_rms(wx.grad, wd.grad)
    gb = rel_rms(bx.grad, bd.grad)
    print("options: loss rel %.2e, grad rel RMS hidden %.2e weight %.2e "
          "bias %.2e" % (e, gh, gw, gb))
    assert e <= REL_LOSS, e
    assert max(gh, gw, gb) <= REL_GRAD[dtype], (gh, gw, gb)


def dead_zone(rng, T, H, V, dtype, r, t):
    """Row r: hidden = 64 e_0, weight[:, 0] in [-0.375, 0.375] except
    weight[t, 0] = 1 and weight[j, 0] = 0.375 for one j != t: z_t = 64,
    the largest other logit exactly 24: a target margin of 40 nats, where
    bf16 logits or a p_t - 1 formed in low precision give a zero loss and
    a zero gradient."""
    h, w, b, y = tensors(rng, T, H, V, dtype, ignore_frac=0.0)
    col = torch.from_numpy(rng.uniform(-0.375, 0.375, V)).to(dtype)
    col[t] = 1.0
    col[(t + 1) % V] = 0.375
    w[:, 0] = col.to(DEV)
    h[r] = 0
    h[r, 0] = 64.0
    y[r] = t
    return h, w, y


@need_gpu
def test_dead_zone_row_keeps_loss_and_gradient(rng):
    T, H, V, r, t = 6, 64, 1500, 2, 321
    dtype = torch.bfloat16
    h, w, y = dead_zone(rng, T, H, V, dtype, r, t)
    hd, wd = leaf(h.double()), leaf(w.double())
    rows, nll, _, z = ref_rows(hd, wd, None, y)
    assert abs((z[r, t] - 64).item()) == 0 and \
        (z[r].topk(2).values[1] - 24).abs().item() < 1e-12
    # reduction 'none', upstream gradient on row r only: the weight gradient
    # then comes from the dead-zone row alone (xent_cuda_linear_backward)
    hx, wx = leaf(h), leaf(w)
    loss = xent.linear_cross_entropy(hx, wx, y, reduction="none")
    g = torch.zeros(T, device=DEV)
    g[r] = 1
    loss.backward(g)
    rows[r].backward()
    want = rows[r].item()
    got = loss[r].item()
    print("dead zone: nll %.6e (reference %.6e), rel %.2e" %
          (got, want, abs(got - want) / want))
    assert got > 0 and abs(got - want) <= REL_LOSS * want, (got, want)
    assert torch.count_nonzero(hx.grad[r]) > 0, "dead-zone row: zero grad"
    assert torch.count_nonzero(wx.grad[t]) > 0, "dead-zone target: zero grad"
    gh, gw = rel_rms(hx.grad[r], hd.grad[r]), rel_rms(wx.grad, wd.grad)
    print("dead zone (none): grad rel RMS hidden row %.2e weight %.2e"
          % (gh, gw))
    assert gh <= REL_GRAD[dtype] and gw <= REL_GRAD[dtype], (gh, gw)
    # reduction 'mean' over the dead-zone row alone (xent_cuda_linear_ce
    # computes the gradients in the forward call)
    hx, wx = leaf(h[r:r + 1]), leaf(w)
    loss = xent.linear_cross_entropy(hx, wx, y[r:r + 1])
    loss.backward()
    hd, wd = leaf(h[r:r + 1].double()), leaf(w.double())
    ref, _, _, _ = ref_rows(hd, wd, None, y[r:r + 1])
    ref.sum().backward()
    assert loss.item() > 0 and rel(loss, ref.sum()) <= REL_LOSS, \
        (loss.item(), ref.sum().item())
    gh, gw = rel_rms(hx.grad, hd.grad), rel_rms(wx.grad, wd.grad)
    print("dead zone (mean): loss %.6e, grad rel RMS hidden %.2e weight "
          "%.2e" % (loss.item(), gh, gw))
    assert wx.grad[t].abs().max() > 0, "dead-zone target: zero grad"
    assert gh <= REL_GRAD[dtype] and gw <= REL_GRAD[dtype], (gh, gw)


@need_gpu
@pytest.mark.parametrize("bias", [False, True])
def test_logprobs_and_entropy(rng, bias):
    """logprob = -nll per row (0 on ignored rows); entropy
    H = lse - sum_j p_j z_j, within 1e-5 relative (the same logit error
    argument: |dH| <= 2 max |dz| (1 + max_j |z_j - lse|) in the worst
    case; tested at the issue's 1e-5 relative)."""
    T, H, V = 33, 80, 1234
    h, w, b, y = tensors(rng, T, H, V, torch.bfloat16, bias=bias)
    poison_cache(4 * T, 4 * T)
    lp, ent = xent.linear_logprobs(h, w, y, b, with_entropy=True)
    assert lp.shape == (T,) and ent.shape == (T,)
    rows, nll, lse, z = ref_rows(h.double(), w.double(),
                                 None if b is None else b.double(), y)
    p = (z - lse[:, None]).exp()
    ent_ref = lse - (p * z).sum(1)
    valid = y != IGN
    lpd, entd = lp.double(), ent.double()
    assert torch.isfinite(lpd).all() and torch.isfinite(entd).all()
    assert torch.all(lpd[~valid] == 0)
    e1 = ((lpd + nll).abs() / nll)[valid].max().item()
    e2 = ((entd - ent_ref).abs() / ent_ref).max().item()
    print("logprobs rel %.2e, entropy rel %.2e" % (e1, e2))
    assert e1 <= REL_LOSS and e2 <= REL_LOSS, (e1, e2)
    lp2, ent2 = xent.linear_logprobs(h, w, y, b, with_entropy=True)
    assert torch.equal(lp2, lp) and torch.equal(ent2, ent)   # repeatable


@need_gpu
def test_return_stats_and_chunks(rng):
    """return_stats gives lse and the row counts; a small chunk_rows gives
    the same loss within the same tolerance (the GEMM may differ per chunk
    size, include/xent/cuda.h)."""
    T, H, V = 300, 64, 999
    h, w, b, y = tensors(rng, T, H, V, torch.bfloat16, ignore_frac=0.2)
    loss, info = xent.linear_cross_entropy(h, w, y, return_stats=True)
    rows, nll, lse, _ = ref_rows(h.double(), w.double(), None, y)
    n = int((y != IGN).sum())
    assert int(info["n_counted"]) == n and int(info["n_nonfinite"]) == 0
    e = ((info["lse"].double() - lse).abs() / lse.abs()).max().item()
    assert e <= REL_LOSS, e
    ref = rows.sum() / n
    assert rel(loss, ref) <= REL_LOSS
    for chunk in (0, 1, 7, 64, 1000):
        got = xent.linear_cross_entropy(h, w, y, chunk_rows=chunk)
        print("chunk_rows %d: loss rel %.2e" % (chunk, rel(got, ref)))
        assert rel(got, ref) <= REL_LOSS, (chunk, rel(got, ref))


@need_gpu
def test_bad_input():
    dev = "cuda"
    h = torch.zeros(4, 8, device=dev, dtype=torch.bfloat16)
    w = torch.zeros(10, 8, device=dev, dtype=torch.bfloat16)
    y = torch.zeros(4, dtype=torch.int64, device=dev)
    with pytest.raises(xent.XentTypeError, match="weight dtype"):
        xent.linear_cross_entropy(h, w.half(), y)
    with pytest.raises(xent.XentTypeError, match="bias dtype"):
        xent.linear_cross_entropy(h, w, y, torch.zeros(10, device=dev))
    with pytest.raises(xent.XentError, match="weight shape"):
        xent.linear_cross_entropy(h, w[:, :7], y)
    with pytest.raises(xent.XentError, match="bias shape"):
        xent.linear_cross_entropy(h, w, y, torch.zeros(
            9, device=dev, dtype=torch.bfloat16))
    with pytest.raises(xent.XentError, match="labels shape"):
        xent.linear_cross_entropy(h, w, y[:3])
    with pytest.raises(xent.XentTypeError, match="labels dtype"):
        xent.linear_cross_entropy(h, w, y.float())
    with pytest.raises(xent.XentTypeError, match="labels is on cpu"):
        xent.linear_cross_entropy(h, w, y.cpu())
    y[2] = 10
    with pytest.raises(xent.XentError, match=r"labels\[2\]"):
        xent.linear_cross_entropy(h, w, y)
    with pytest.raises(xent.XentError, match=r"labels\[2\]"):
        xent.linear_logprobs(h, w, y)


@need_gpu
def test_no_TxV_memory(rng):
    """Peak extra memory of forward + backward: the gradients, the
    workspace (chunks of chunk_rows rows and the fp32 weight-gradient
    accumulator) and O(T); far below one fp32 [T, V]."""
    T, H, V, chunk = 4096, 256, 32000, 256
    h, w, _, y = tensors(rng, T, H, V, torch.bfloat16)
    hx, wx = leaf(h), leaf(w)
    with torch.no_grad():
        prep = _linear._Prepared("test", h, w, None, y)
        grads, bufs = prep.grads(True, True, False)
        ws = prep.workspace(grads, chunk)[1]      # bytes
        del prep, grads, bufs
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = xent.linear_cross_entropy(hx, wx, y, chunk_rows=chunk)
    loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    grads = (T + V) * H * 2
    print("T=%d H=%d V=%d chunk_rows=%d: peak extra %.1f MiB (workspace "
          "%.1f MiB, gradients %.1f MiB, fp32 [T, V] %.1f MiB)"
          % (T, H, V, chunk, extra / 2**20, ws / 2**20, grads / 2**20,
             T * V * 4 / 2**20))
    assert extra <= ws + grads + 64 * T + (1 << 20), (extra, ws, grads)
    assert extra < T * V * 4


@need_gpu
def test_cuda_graph_capture(rng):
    """Forward + backward captured in a CUDA graph and replayed give the
    bits of the uncaptured call (same shapes and chunks: same GEMMs)."""
    T, H, V = 128, 64, 3000
    h, w, _, y = tensors(rng, T, H, V, torch.bfloat16)
    ref_h, ref_w = leaf(h), leaf(w)
    ref = xent.linear_cross_entropy(ref_h, ref_w, y)
    ref.backward()
    hx, wx = leaf(h), leaf(w)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            hx.grad = wx.grad = None
            xent.linear_cross_entropy(hx, wx, y).backward()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    hx.grad = wx.grad = None
    with torch.cuda.graph(graph):
        loss = xent.linear_cross_entropy(hx, wx, y)
        loss.backward()
    graph.replay()
    torch.cuda.synchronize()
    assert loss.item() == ref.item()
    assert torch.equal(hx.grad, ref_h.grad)
    assert torch.equal(wx.grad, ref_w.grad)
