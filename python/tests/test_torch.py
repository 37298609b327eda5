"""PyTorch front end (CPU everywhere torch is installed; CUDA where libxent
has CUDA kernels and a GPU is visible). Skipped with a message without
torch (CI does not install it)."""
import numpy as np
import pytest

try:
    import torch
except ImportError as e:        # not installed, or an install that is broken
    pytest.skip("PyTorch is not importable (%s): the torch tests are skipped "
                "(pip install torch to run them)" % e,
                allow_module_level=True)
import torch.nn.functional as F  # noqa: E402

import xent  # noqa: E402
from reference import rows  # noqa: E402
from util import check_faithful, ulp  # noqa: E402

IGN = -100
CUDA = xent.cuda_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
need_cuda = pytest.mark.skipif(
    not CUDA, reason="no CUDA: libxent built without CUDA or no GPU visible")


def make(rng, T=29, V=500, scale=3.0, ignore_frac=0.2, device="cpu",
         dtype=torch.float32):
    z = torch.from_numpy(rng.standard_normal((T, V)) * scale).to(dtype)
    y = torch.from_numpy(rng.integers(0, V, size=T))
    y[torch.from_numpy(rng.random(T) < ignore_frac)] = IGN
    return z.to(device), y.to(device)


def leaf(z):
    return z.detach().clone().requires_grad_(True)


def check_vs_double(got, want, what):
    """xent's fp32 output against an fp64 torch result on the same inputs:
    within one fp32 ulp (faithful rounding, util.py) plus 2^-45 of the
    largest |value| for the fp64 computation's own rounding (its sums and
    p_t - 1 lose at most ~V * 2^-53 of the largest term)."""
    got = got.detach().double().cpu().numpy()
    want = want.detach().cpu().numpy()
    tol = ulp(want) + 2.0 ** -45 * np.max(np.abs(want))
    err = np.abs(got - want)
    i = np.unravel_index(np.argmax(err - tol), err.shape)
    assert np.all(err <= tol), "%s: got %r want %r at %s" % (
        what, got[i], want[i], i)


# --- agreement with the float64 references --------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_agrees_with_F_cross_entropy_float64(rng, device, reduction,
                                             smoothing):
    z, y = make(rng, device=device)
    a, b = leaf(z), leaf(z.double())
    la = xent.cross_entropy(a, y, reduction=reduction,
                            label_smoothing=smoothing)
    lb = F.cross_entropy(b, y, reduction=reduction, ignore_index=IGN,
                         label_smoothing=smoothing)
    assert la.dtype == torch.float32 and la.shape == lb.shape
    check_vs_double(la, lb, "loss")
    w = torch.from_numpy(rng.standard_normal(la.shape)).float().double() \
        .to(device)                 # fp32-exact upstream weights
    (la * w.float()).sum().backward()
    (lb * w).sum().backward()
    assert a.grad.dtype == torch.float32
    check_vs_double(a.grad, b.grad, "grad")


def test_matches_numpy_binding_bitwise(rng):
    z, y = make(rng)
    opts = dict(temperature=0.8, softcap=5.0, z_loss=1e-3,
                label_smoothing=0.05)
    a = leaf(z)
    loss = xent.cross_entropy(a, y, **opts)
    loss.backward()
    nl, ng = xent.cross_entropy_grad(z.numpy(), y.numpy(), **opts)
    assert loss.item() == nl and np.array_equal(a.grad.numpy(), ng)


@pytest.mark.parametrize("device", DEVICES)
def test_dead_zone_rows(device):
    """Margin-20 rows: F.cross_entropy in fp32 returns loss 0 and target
    gradient 0; xent returns log1p(exp(-20)) and its gradient."""
    V, T = 8192, 4
    z = torch.zeros(T, V)
    y = torch.tensor([3, 100, 5000, 8191])
    for r in range(T):
        z[r, y[r]] = 20.0 + float(np.log(V - 1))
    z, y = z.to(device), y.to(device)
    zf = leaf(z)
    lf = F.cross_entropy(zf, y, reduction="sum")
    lf.backward()
    assert lf.item() == 0.0
    assert torch.all(zf.grad[torch.arange(T), y] == 0)
    zx = leaf(z)
    lx = xent.cross_entropy(zx, y, reduction="none")
    lx.sum().backward()
    ref = rows(z.cpu().numpy(), y.cpu().numpy())
    check_faithful(lx.detach().cpu().numpy(), ref["loss"], what="nll")
    check_faithful(zx.grad.cpu().numpy(), ref["grad"], mag=ref["gmag"],
                   what="grad")
    assert torch.all(zx.grad[torch.arange(T, device=device), y] < 0)


def test_gradcheck_through_fp32():
    """torch.autograd.gradcheck in float64 through the fp32 kernel.

    Tolerance: f(x) = xent(fp32(x)). The central difference
    (f(x+e) - f(x-e)) / 2e with e = 1e-3 has error at most delta / e, where
    delta bounds |f error| = 1 fp32 ulp of f (< 2^-23 for |f| < 2) plus the
    rounding of x+e to fp32 (|x| < 2: 2^-23) times |df/dx| <= 1, so
    delta < 2^-22 and delta / e < 2.4e-4, plus the O(e^2 f''') < 1e-6 term;
    the analytic fp32 gradient is within 1 ulp (6e-8). atol = 1e-3 > 4x."""
    gen = np.random.default_rng(1)
    x = torch.from_numpy(gen.uniform(-2, 2, (4, 7))).requires_grad_(True)
    y = torch.tensor([1, IGN, 6, 0])
    for kw in ({}, {"reduction": "sum"}, {"reduction": "none"},
               {"temperature": 1.5, "softcap": 3.0, "z_loss": 0.01,
                "label_smoothing": 0.1}):
        def f(x):
            return xent.cross_entropy(x.float(), y, **kw).double()
        assert torch.autograd.gradcheck(f, (x,), eps=1e-3, atol=1e-3,
                                        rtol=1e-3), kw


@pytest.mark.parametrize("device", DEVICES)
def test_logprobs(rng, device):
    z, y = make(rng, device=device)
    lp, ent = xent.logprobs(z, y, temperature=0.9, entropy=True)
    assert not lp.requires_grad and lp.device == z.device
    ref = rows(z.cpu().numpy(), y.cpu().numpy(), temperature=0.9)
    check_faithful(lp.cpu().numpy(), -ref["nll"], what="logprob")
    check_faithful(ent.cpu().numpy(), ref["ent"], mag=ref["emag"],
                   what="entropy")
    assert torch.equal(xent.logprobs(z, y, temperature=0.9), lp)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_logits(rng, device):
    z, y = make(rng, device=device, dtype=torch.bfloat16)
    a = leaf(z)
    loss = xent.cross_entropy(a, y)
    loss.backward()
    assert a.grad.dtype == torch.bfloat16
    ref = rows(z.float().cpu().numpy(), y.cpu().numpy())
    n = ref["counted"].sum()
    check_faithful(loss.item(), ref["loss"].sum() / n, what="loss")
    check_faithful(a.grad.float().cpu().numpy(), ref["grad"] / n, fmt="bf16",
                   mag=ref["gmag"] / n, what="bf16 grad")


def test_module_drop_in(rng):
    z, y = make(rng)
    z3, y3 = z.reshape(29, 1, 500), y.reshape(29, 1)
    m = xent.CrossEntropyLoss(ignore_index=IGN, label_smoothing=0.1)
    t = torch.nn.CrossEntropyLoss(ignore_index=IGN, label_smoothing=0.1)
    check_vs_double(m(z, y), t(z.double(), y), "module loss")
    assert m(z3, y3).shape == ()
    assert xent.CrossEntropyLoss(reduction="none")(z3, y3).shape == (29, 1)
    with pytest.raises(xent.XentError, match="weight is not supported"):
        xent.CrossEntropyLoss(weight=torch.ones(500))
    with pytest.raises(xent.XentError, match="movedim"):
        m(z.reshape(29, 500, 1), y.reshape(29, 1))    # torch's [N, C, d]


def test_inplace_backward_leaves_grad_in_logits(rng):
    z, y = make(rng)
    a = leaf(z)
    xent.cross_entropy(a, y).backward()
    x = leaf(z)
    h = x * 1.0                       # the logits buffer the loss reads
    loss = xent.cross_entropy(h, y, inplace_backward=True)
    loss.backward(retain_graph=True)
    assert torch.equal(x.grad, a.grad)
    assert torch.equal(h.detach(), a.grad)      # the buffer holds dL/dz
    with pytest.raises(xent.XentError, match="second backward"):
        loss.backward()


def test_reduction_none_upstream_and_batch_shape(rng):
    z, y = make(rng, T=24, V=64)
    a = leaf(z.reshape(4, 6, 64))
    loss = xent.cross_entropy(a, y.reshape(4, 6), reduction="none")
    assert loss.shape == (4, 6)
    w = torch.from_numpy(rng.standard_normal((4, 6))).float()
    (loss * w).sum().backward()
    _, g = xent.cross_entropy_grad(z.numpy(), y.numpy(), reduction="none",
                                   grad_output=w.reshape(-1).numpy())
    assert np.array_equal(a.grad.reshape(24, 64).numpy(), g)


def test_strided_rows_handled(rng):
    z, y = make(rng, T=10, V=300)
    y = torch.where(y == IGN, y, y % 200)
    a = leaf(z)
    part = a[:, 50:250]                 # row stride 300, no copy
    loss = xent.cross_entropy(part, y)
    loss.backward()
    b = leaf(z[:, 50:250].contiguous())
    xent.cross_entropy(b, y).backward()
    assert torch.equal(a.grad[:, 50:250], b.grad)
    assert not torch.any(a.grad[:, :50]) and not torch.any(a.grad[:, 250:])


def test_empty_batch():
    z = torch.zeros(0, 10, requires_grad=True)
    loss = xent.cross_entropy(z, torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0 and z.grad.shape == (0, 10)


# --- bad input -------------------------------------------------------------


def test_bad_inputs_raise_and_leave_logits_untouched(rng):
    z, y = make(rng, T=5, V=10, ignore_frac=0)
    # float64 CPU logits are accepted (xent_ce_f64, python/tests/test_f64.py)
    with pytest.raises(xent.XentError, match="softcap"):
        xent.cross_entropy(z.double(), y, softcap=30.0)
    with pytest.raises(xent.XentTypeError, match="labels dtype"):
        xent.cross_entropy(z, y.float())
    with pytest.raises(xent.XentError, match="labels shape"):
        xent.cross_entropy(z, y[:3])
    with pytest.raises(xent.XentError, match=r"\.contiguous\(\)"):
        xent.cross_entropy(torch.randn(10, 5).t(), y)
    with pytest.raises(xent.XentTypeError, match="torch.Tensor"):
        xent.cross_entropy(z, y.numpy())
    with pytest.raises(xent.XentError, match="cross_entropy_grad takes"):
        xent.cross_entropy_grad(z, y)
    with pytest.raises(xent.XentError, match="temperature"):
        xent.cross_entropy(z, y, temperature=-1.0)
    with pytest.raises(xent.XentTypeError, match="device meta"):
        xent.cross_entropy(z.to("meta"), y.to("meta"))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_label_raises_and_leaves_logits_untouched(rng, device):
    z, y = make(rng, T=5, V=10, ignore_frac=0, device=device)
    y[2] = 10
    x = leaf(z)
    h = x * 1.0
    before = h.detach().clone()
    with pytest.raises(xent.XentError, match=r"labels\[2\] = 10 is outside"):
        xent.cross_entropy(h, y, inplace_backward=True)
    with pytest.raises(xent.XentError, match=r"labels\[2\] = 10 is outside"):
        xent.logprobs(h, y)
    assert torch.equal(h.detach(), before)


@need_cuda
def test_wrong_device_labels(rng):
    z, y = make(rng, T=5, V=10, ignore_frac=0, device="cuda")
    with pytest.raises(xent.XentTypeError, match="labels are on cpu"):
        xent.cross_entropy(z, y.cpu())


# --- CUDA -------------------------------------------------------------------


@need_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_cpu(rng, dtype):
    """Forward within 2 ulp of the CPU, gradients within 1 ulp
    (include/xent/cuda.h); bf16 grads within 1 bf16 ulp."""
    z, y = make(rng, T=64, V=3000, dtype=dtype)
    a, b = leaf(z), leaf(z.cuda())
    la = xent.cross_entropy(a, y, reduction="none")
    lb = xent.cross_entropy(b, y.cuda(), reduction="none")
    la.sum().backward()
    lb.sum().backward()
    lad = la.detach().double().numpy()
    assert np.all(np.abs(lb.detach().cpu().double().numpy() - lad)
                  <= 2 * ulp(lad))
    fmt = "bf16" if dtype == torch.bfloat16 else "f32"
    ga = a.grad.double().numpy()
    assert np.all(np.abs(b.grad.cpu().double().numpy() - ga)
                  <= ulp(ga, fmt))


@need_cuda
def test_cuda_exact_mode(rng):
    """exact=True: bf16 logits on the precise path. On rows where one other
    column dominates the sum (the fast path's worst case: nll =
    log1p(e^-d) carries the exp2's error whole), the loss, log-probs and
    entropy are within 2 ulp of the CPU's, the gradient within 1 bf16 ulp;
    the per-thread setting does not outlive the call."""
    T, V = 64, 5000
    y = torch.from_numpy(rng.integers(0, V, size=T))
    other = (y + 1 + torch.from_numpy(rng.integers(0, V - 1, size=T))) % V
    d = torch.from_numpy(rng.uniform(0.25, 17.0, size=T)).float()
    z = torch.full((T, V), -60.0)
    z[torch.arange(T), y] = 0.0
    z[torch.arange(T), other] = -d
    z = z.bfloat16()
    a, b = leaf(z), leaf(z.cuda())
    la = xent.cross_entropy(a, y, reduction="none", exact=True)
    lb = xent.cross_entropy(b, y.cuda(), reduction="none", exact=True)
    la.sum().backward()
    lb.sum().backward()
    lad = la.detach().double().numpy()
    assert np.all(np.abs(lb.detach().cpu().double().numpy() - lad)
                  <= 2 * ulp(lad))
    ga = a.grad.double().numpy()
    assert np.all(np.abs(b.grad.cpu().double().numpy() - ga)
                  <= ulp(ga, "bf16"))
    pa, ea = xent.logprobs(z, y, entropy=True)
    pb, eb = xent.logprobs(z.cuda(), y.cuda(), entropy=True, exact=True)
    for got, want in ((pb, pa), (eb, ea)):
        want = want.double().numpy()
        assert np.all(np.abs(got.cpu().double().numpy() - want)
                      <= 2 * ulp(want))
    setting = xent._capi.LIB.fn("xent_cuda_set_exact")
    assert setting(0) == 0


@need_cuda
def test_cuda_no_extra_TxV_memory(rng):
    """Forward + backward allocate the gradient [T, V] and O(T) more;
    with inplace_backward not even the gradient."""
    T, V = 4096, 32000
    z = torch.randn(T, V, device="cuda", dtype=torch.bfloat16)
    y = torch.randint(0, V, (T,), device="cuda")
    tv = T * V * z.element_size()
    for inplace, allowed in ((False, tv), (True, 0)):
        x = z.clone().requires_grad_(True)
        h = x.view_as(x) if not inplace else x * 1
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = xent.cross_entropy(h, y, inplace_backward=inplace)
        torch.autograd.grad(loss, h)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
        print("T=%d V=%d bf16 inplace=%s: peak extra %d bytes (T*V*2 = %d)"
              % (T, V, inplace, extra, tv))
        assert extra <= allowed + 64 * T + (1 << 20), (inplace, extra, tv)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    xent.logprobs(z, y, entropy=True)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    print("logprobs+entropy: peak extra %d bytes" % extra)
    assert extra <= 64 * T + (1 << 20)


@need_cuda
def test_cuda_graph_capture(rng):
    z, y = make(rng, T=256, V=4000, device="cuda")
    x = leaf(z)
    static_y = y.clone()
    ref_x = leaf(z)
    ref = xent.cross_entropy(ref_x, y)
    ref.backward()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                  # warm-up on a side stream
        for _ in range(2):
            x.grad = None
            xent.cross_entropy(x, static_y).backward()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(g):
        loss = xent.cross_entropy(x, static_y)
        loss.backward()
    g.replay()
    torch.cuda.synchronize()
    assert loss.item() == ref.item()
    # Under capture the mean's 1/n is folded into the float32 grad_rows
    # (relative error <= 2^-24 = 1/2 ulp), so each element is within
    # 1 ulp (faithful) + 1/2 ulp of the exact value, and the uncaptured one
    # within 1 ulp: they differ by at most 3 ulp.
    a = x.grad.cpu().double().numpy()
    b = ref_x.grad.cpu().double().numpy()
    assert np.all(np.abs(a - b) <= 3 * ulp(b))
