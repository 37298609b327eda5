"""xent.nn.functional.cross_entropy / xent.nn.CrossEntropyLoss as drop-ins
for torch's (issue 51): PyTorch's own OpInfo samples of
nn.functional.cross_entropy and ModuleInfo inputs of nn.CrossEntropyLoss
(torch.testing._internal, CPU, every dtype they list) go through xent and
must match torch's float64 result (forward and gradient) within torch's
default tolerance for the sample's dtype (torch.testing.assert_close's
table); -inf masking, the NaN mean over zero rows, autograd's refusals and
torch.compile(fullgraph=True)."""
import pytest

try:
    import torch
except ImportError as e:        # not installed, or an install that is broken
    pytest.skip("PyTorch is not importable (%s): the drop-in tests are "
                "skipped (pip install torch to run them)" % e,
                allow_module_level=True)
import torch.nn.functional as F  # noqa: E402

import xent.nn  # noqa: E402
import xent.nn.functional as XF  # noqa: E402

# torch.testing.assert_close's default (rtol, atol) per dtype
TOL = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
       torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}
INF = float("inf")


def _internal():
    try:
        from torch.testing._internal.common_methods_invocations import op_db
        from torch.testing._internal.common_modules import module_db
    except ImportError as e:    # expecttest missing (.ci/setup-pip.txt)
        pytest.fail("torch.testing._internal is not importable: %s" % e)
    return op_db, module_db


def _double(x, grad=False):
    """float64 copies (integer tensors unchanged); grad: a leaf that
    requires grad (the input only)."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        return (x.double() if x.is_floating_point() else x.clone())\
            .requires_grad_(grad and x.is_floating_point())
    if isinstance(x, (list, tuple)):
        return type(x)(_double(v) for v in x)
    if isinstance(x, dict):
        return {k: _double(v) for k, v in x.items()}
    return x


def _leaf(x):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().clone().requires_grad_(True)
    return x


def _compare(got, want, dtype, what):
    rtol, atol = TOL[dtype]
    assert got.dtype == dtype, (what, got.dtype, dtype)
    g = got.detach().double()
    w = want.detach().double()
    # NaN never passes unless torch's float64 result is NaN there too
    assert torch.equal(torch.isnan(g), torch.isnan(w)), (what, g, w)
    torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True,
                               msg=lambda m: "%s: %s" % (what, m))


def _check_call(fx, fref, inp, args, kwargs, dtype, what):
    """fx(inp, *args) vs fref on float64 copies: forward, then the gradient
    of inp under the same upstream gradient."""
    x = _leaf(inp)
    args_x = [a.detach() if isinstance(a, torch.Tensor) else a
              for a in args]
    kwargs = {k: v.detach() if isinstance(v, torch.Tensor) else v
              for k, v in kwargs.items()}
    got = fx(x, *args_x, **kwargs)
    xr = _double(inp, grad=True)
    want = fref(xr, *_double(list(args)), **_double(kwargs))
    _compare(got, want, dtype, what + " forward")
    if not x.requires_grad or not torch.isfinite(want).all():
        return
    up = torch.linspace(0.5, 1.5, max(want.numel(), 1),
                        dtype=torch.float64).reshape(want.shape)
    gx, = torch.autograd.grad(got, x, up.to(got.dtype))
    gr, = torch.autograd.grad(want, xr, up)
    _compare(gx, gr, dtype, what + " grad")


OPINFO_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", OPINFO_DTYPES, ids=str)
def test_opinfo_samples_match_torch_float64(dtype):
    op_db, _ = _internal()
    op = [o for o in op_db if o.name == "nn.functional.cross_entropy"]
    assert len(op) == 1
    op = op[0]
    if dtype not in op.supported_dtypes("cpu"):
        pytest.skip("OpInfo lists no %s on the CPU" % dtype)
    n = 0
    for i, s in enumerate(op.sample_inputs("cpu", dtype, requires_grad=True)):
        _check_call(XF.cross_entropy, F.cross_entropy, s.input,
                    list(s.args), dict(s.kwargs), dtype,
                    "OpInfo sample %d (%s, %s)" % (i, tuple(s.input.shape),
                                                   s.kwargs))
        n += 1
    assert n >= 10, n       # the samples exist: a test that can fail
    print("OpInfo %s: %d samples" % (dtype, n))


@pytest.mark.parametrize("dtype", OPINFO_DTYPES, ids=str)
def test_moduleinfo_inputs_match_torch_float64(dtype):
    _, module_db = _internal()
    mi = [m for m in module_db if m.module_cls is torch.nn.CrossEntropyLoss]
    assert len(mi) == 1
    mi = mi[0]
    inputs = mi.module_inputs_func(mi, device="cpu", dtype=dtype,
                                   requires_grad=True, training=True)
    n = 0
    for i, m in enumerate(inputs):
        ca, ck = m.constructor_input.args, m.constructor_input.kwargs
        fa, fk = m.forward_input.args, m.forward_input.kwargs
        ours = xent.nn.CrossEntropyLoss(*ca, **ck)
        ref = torch.nn.CrossEntropyLoss(*_double(list(ca)), **_double(ck))
        _check_call(lambda x, *a, **k: ours(x, *a, **k),
                    lambda x, *a, **k: ref(x, *a, **k),
                    fa[0], list(fa[1:]), dict(fk), dtype,
                    "ModuleInfo input %d (%s, %s)" % (i, ck, tuple(
                        fa[0].shape)))
        n += 1
    assert n >= 10, n
    print("ModuleInfo %s: %d inputs" % (dtype, n))


# --- -inf masking, empty means ---------------------------------------------


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_neg_inf_masking_matches_torch(rng, eps, reduction, dtype):
    z = torch.from_numpy(rng.standard_normal((9, 40)) * 3).to(dtype)
    mask = torch.from_numpy(rng.random((9, 40)) < 0.3)
    z = z.masked_fill(mask, -INF)
    y = torch.from_numpy(rng.integers(0, 40, size=9))
    y[0] = -100
    y[1] = int(torch.nonzero(~mask[1])[0])        # a finite target
    z[2, y[2]] = -INF                             # target at -inf: +inf loss
    z[3] = -INF                                   # a whole row: NaN
    _check_call(XF.cross_entropy, F.cross_entropy, z, [y],
                dict(reduction=reduction, label_smoothing=eps), dtype,
                "masked")
    # rows without the inf/NaN ones: finite result, gradient checked
    keep = torch.tensor([0, 1, 4, 5, 6, 7, 8])
    zk = z[keep]
    zk[:, 0] = 0.5                   # at least one finite logit per row
    yk = y[keep].masked_fill(zk.gather(1, y[keep].clamp(min=0)[:, None])[
        :, 0].isinf() & (y[keep] >= 0), 0)
    if eps == 0:
        _check_call(XF.cross_entropy, F.cross_entropy, zk, [yk],
                    dict(reduction=reduction), dtype, "masked finite")


def test_mean_over_zero_rows_is_nan_like_torch():
    z = torch.randn(3, 5, requires_grad=True)
    y = torch.full((3,), -100)
    got = XF.cross_entropy(z, y)
    assert torch.isnan(got) and torch.isnan(F.cross_entropy(z, y))
    g, = torch.autograd.grad(got, z)
    assert torch.equal(g, torch.zeros_like(z))
    w = torch.zeros(5)
    assert torch.isnan(XF.cross_entropy(z, torch.tensor([1, 2, 3]),
                                        weight=w))


def test_strided_and_unbatched_inputs(rng):
    big = torch.from_numpy(rng.standard_normal((6, 30))).float()
    z = big[:, 3:20]                      # rows strided, columns unit
    y = torch.from_numpy(rng.integers(0, 17, size=6))
    _check_call(XF.cross_entropy, F.cross_entropy, z, [y], {},
                torch.float32, "column slice")
    zt = torch.from_numpy(rng.standard_normal((17, 6))).float().t()
    _check_call(XF.cross_entropy, F.cross_entropy, zt, [y], {},
                torch.float32, "transposed")
    _check_call(XF.cross_entropy, F.cross_entropy, big[0], [y[0]],
                dict(reduction="none"), torch.float32, "unbatched")


# --- autograd honesty, compile ----------------------------------------------


def test_double_backward_and_forward_ad_refuse_clearly():
    z = torch.randn(4, 7, requires_grad=True)
    y = torch.tensor([1, 2, 3, 4])
    loss = XF.cross_entropy(z, y)
    g, = torch.autograd.grad(loss, z, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), z)
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        d = fwAD.make_dual(z.detach(), torch.ones_like(z))
        with pytest.raises(RuntimeError):
            XF.cross_entropy(d, y)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_torch_compile_fullgraph(rng, reduction):
    lin = torch.nn.Linear(16, 50)
    crit = xent.nn.CrossEntropyLoss(reduction=reduction,
                                    label_smoothing=0.1)

    def step(x, y):
        return crit(lin(x), y)

    x = torch.from_numpy(rng.standard_normal((12, 16))).float()
    y = torch.from_numpy(rng.integers(0, 50, size=12))
    y[0] = -100
    eager = step(x, y)
    ge = torch.autograd.grad(eager.sum(), lin.weight)[0]
    try:
        cstep = torch.compile(step, fullgraph=True, backend="aot_eager")
        comp = cstep(x, y)
    except Exception as e:       # pragma: no cover - the failure message
        pytest.fail("torch.compile(fullgraph=True) failed: %r" % (e,))
    gc = torch.autograd.grad(comp.sum(), lin.weight)[0]
    assert torch.equal(comp, eager)
    assert torch.equal(gc, ge)


def test_torch_export_keeps_the_custom_op():
    class M(torch.nn.Module):
        def forward(self, z, y):
            return XF.cross_entropy(z, y)

    z, y = torch.randn(5, 9), torch.tensor([0, 1, 2, 3, 4])
    ep = torch.export.export(M(), (z, y))
    assert "xent.ce_fwd" in str(ep.graph), ep.graph
    assert torch.equal(ep.module()(z, y), M()(z, y))


# --- the CPU fwd+bwd fusion (speed, issue 51) --------------------------------


def _grads(f, z, y, up, **kw):
    x = z.detach().clone().requires_grad_(True)
    loss = f(x, y, **kw)
    if up is None:
        loss.backward()
    else:
        (loss * up).backward()
    return loss.detach(), x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16,
                                   torch.float16], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("up", [None, 0.5, 3.0])
def test_fused_backward_gives_the_same_bits(rng, dtype, reduction, eps, up):
    """The forward that also writes the gradient (upstream 1) and the
    backward that recomputes it (any other upstream) give the bits of the
    unfused path; with upstream 1 the kernel's buffer becomes .grad (no
    copy)."""
    from xent import _torch as XT
    z = torch.from_numpy(rng.standard_normal((37, 301)) * 4).to(dtype)
    y = torch.from_numpy(rng.integers(0, 301, size=37))
    y[::7] = -100
    kw = dict(reduction=reduction, label_smoothing=eps)
    prev = XT.set_fused_backward(False)
    try:
        want = _grads(XF.cross_entropy, z, y, up, **kw)
        want_api = _grads(xent.cross_entropy, z, y, up, **kw)
    finally:
        XT.set_fused_backward(prev)
    assert XT.FUSED_BACKWARD
    got = _grads(XF.cross_entropy, z, y, up, **kw)
    got_api = _grads(xent.cross_entropy, z, y, up, **kw)
    for (lw, gw), (lg, gg) in ((want, got), (want_api, got_api)):
        assert torch.equal(lw, lg)
        assert torch.equal(gw, gg)
    # handed over, not copied: the grad's buffer was the kernel's output
    seen = []
    take = XT.take_fused_grad

    def spy(ctx, g):
        p = take(ctx, g)
        seen.append(None if p is None else p.data_ptr())
        return p
    XT.take_fused_grad = spy
    try:
        x = z.detach().clone().requires_grad_(True)
        XF.cross_entropy(x, y, **kw).backward()
    finally:
        XT.take_fused_grad = take
    assert seen == [x.grad.data_ptr()]


def test_fused_backward_twice_and_no_grad(rng):
    z = torch.from_numpy(rng.standard_normal((9, 50))).float()
    y = torch.from_numpy(rng.integers(0, 50, size=9))
    x = z.clone().requires_grad_(True)
    loss = XF.cross_entropy(x, y)
    g1, = torch.autograd.grad(loss, x, retain_graph=True)
    g2, = torch.autograd.grad(loss, x)             # recomputed: same bits
    assert torch.equal(g1, g2) and g1.data_ptr() != g2.data_ptr()
    with torch.no_grad():                          # no gradient written
        assert torch.equal(XF.cross_entropy(x, y), loss.detach())


def test_gradient_buffers_are_reused_only_when_free(rng):
    """Large CPU gradients come from xent's pool (xent._torch.empty_rows): a
    buffer that any tensor (or view) still uses is never handed out again."""
    from xent import _torch as XT
    V = XT._REUSE_MIN // 4 // 8 + 1          # fp32 [8, V] > the threshold
    z = torch.from_numpy(rng.standard_normal((8, V))).float()
    y = torch.from_numpy(rng.integers(0, V, size=8))

    def grad():
        x = z.clone().requires_grad_(True)
        XF.cross_entropy(x, y).backward()
        return x.grad

    g1 = grad()
    want = g1.clone()
    view = g1[2:4]
    p1 = g1.data_ptr()
    del g1
    g2 = grad()
    assert g2.data_ptr() != p1 and torch.equal(view, want[2:4])
    del view
    g3 = grad()                                 # g1's buffer, free again
    assert g3.data_ptr() == p1 and torch.equal(g3, want)
    assert torch.equal(g2, want)
    del g2, g3
    assert XT.release_buffers() >= 2 * z.numel() * 4
