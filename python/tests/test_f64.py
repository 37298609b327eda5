"""float64 logits (issue 51): xent_ce_f64 and the torch front ends that route
float64 CPU tensors to it (xent.nn.functional.cross_entropy, xent.cross_entropy,
xent.logprobs). Every float64 output must be faithfully rounded (one of the
two doubles around the exact value; docs/numerics.md, "The float64 path"),
checked against an oracle in Python's decimal module at 420 digits (about
1400 bits: enough for terms down to e^-745 next to 1) with cancellation-free
forms. With label smoothing the gradient has the absolute bound of the
docs. -inf logits are exact zeros of probability."""
import ctypes
import decimal
import math

import numpy as np
import pytest

try:
    import torch
except ImportError as e:        # pragma: no cover
    pytest.skip("PyTorch is not importable (%s)" % e, allow_module_level=True)
import torch.nn.functional as F  # noqa: E402

import xent  # noqa: E402
import xent.nn.functional as XF  # noqa: E402
from xent import _capi as C  # noqa: E402
from xent import _torch as XT  # noqa: E402

D = decimal.Decimal
CTX = decimal.Context(prec=420, Emin=-10 ** 8, Emax=10 ** 8)
INF = float("inf")


def _dexp(x):
    return D(0) if x < -4000 else CTX.exp(x)


def oracle_row(z, t, tau=1.0, eps=0.0, kz=0.0, g=1.0):
    """Exact (420 digits) outputs of one row: dict with nll, lse, entropy,
    loss and grad (list, upstream g), or None for a non-finite row."""
    with decimal.localcontext(CTX):
        return _oracle_row(z, t, tau, eps, kz, g)


def _oracle_row(z, t, tau, eps, kz, g):
    V = len(z)
    if any(math.isnan(v) or v == INF for v in z):
        return None
    fin = [j for j in range(V) if z[j] != -INF]
    if not fin:
        return None
    tauD = D(tau)
    zz = {j: CTX.divide(D(z[j]), tauD) for j in fin}
    M = max(zz.values())
    e = {j: _dexp(CTX.subtract(zz[j], M)) for j in fin}
    S = CTX.add(sum(e.values(), D(0)), D(0))
    L = CTX.ln(S)
    lse = CTX.add(M, L)
    p = {j: CTX.divide(e[j], S) for j in fin}
    H = sum((CTX.multiply(p[j], CTX.subtract(L, CTX.subtract(zz[j], M)))
             for j in fin), D(0))
    out = {"lse": lse, "entropy": H}
    if t is None:
        out.update(nll=D(0), loss=D(0), grad=[D(0)] * V)
        return out
    if z[t] == -INF:
        nll = D("Infinity")
    elif zz[t] >= M:
        q = sum((_dexp(CTX.subtract(zz[j], zz[t])) for j in fin if j != t),
                D(0))
        nll = CTX.ln(CTX.add(D(1), q))
    else:
        nll = CTX.subtract(lse, zz[t])
    if len(fin) < V:
        ls = D("Infinity")
    else:
        ls = CTX.subtract(L, CTX.divide(
            sum((CTX.subtract(zz[j], M) for j in fin), D(0)), D(V)))
    loss = D(0)
    if eps < 1:
        loss += CTX.multiply(D(1) - D(eps), nll)
    if eps > 0:
        loss += CTX.multiply(D(eps), ls)
    if kz > 0:
        loss += CTX.multiply(D(kz), CTX.multiply(lse, lse))
    out.update(nll=nll, loss=loss)
    a = D(1) + 2 * D(kz) * lse
    G = CTX.divide(D(g), tauD)
    pnt = sum((p[j] for j in fin if j != t), D(0))     # 1 - p_t, exact
    grad = []
    for j in range(V):
        pj = p.get(j, D(0))
        if j == t:
            v = (a - 1) * pj - (1 - D(eps)) * pnt + D(eps) * (pj - D(1) / V)
        else:
            v = a * pj - D(eps) / V
        grad.append(CTX.multiply(G, v))
    out["grad"] = grad
    return out


def faithful(y, X):
    """y (a double) is one of the two doubles around X (a Decimal)."""
    if X.is_infinite():
        return y == float(X)
    a = float(X)
    if D(a) == X:
        return y == a
    b = math.nextafter(a, INF if D(a) < X else -INF)
    return y in (a, b)


def ulp_err(y, X):
    if X.is_infinite() or math.isinf(y):
        return 0.0 if y == float(X) else INF
    sp = math.ulp(float(X)) if float(X) != 0 else 5e-324
    return float(abs(D(y) - X) / D(sp))


def run_c(z, y, *, reduction="none", tau=1.0, eps=0.0, kz=0.0,
          grad=True, grad_rows=None, grad_scale=1.0, ld=None):
    """xent_ce_f64 through ctypes on a float64 numpy array [T, V]."""
    T_, V = z.shape
    if ld is not None:
        buf = np.full((T_, ld), np.nan)
        buf[:, :V] = z
        zc = buf
    else:
        zc = np.ascontiguousarray(z)
    yy = np.ascontiguousarray(y, dtype=np.int64)
    inp = C.CeInput()
    inp.logits, inp.dtype, inp.T, inp.V = zc.ctypes.data, C.F64, T_, V
    inp.ld = ld or 0
    inp.labels, inp.label_dtype = yy.ctypes.data, C.I64
    opts = C.make_opts(reduction=reduction, temperature=tau,
                       label_smoothing=eps, z_loss=kz, grad_scale=grad_scale)
    nloss = T_ if reduction == "none" else 1
    r = {k: np.full(T_, np.nan) for k in ("nll", "lp", "lse", "ent")}
    r["loss"] = np.full(nloss, np.nan)
    r["grad"] = np.full((T_, V), np.nan) if grad else None
    cnt = np.zeros(2, dtype=np.int64)
    out = C.CeOutputF64()
    out.loss, out.nll = r["loss"].ctypes.data, r["nll"].ctypes.data
    out.logprob, out.lse = r["lp"].ctypes.data, r["lse"].ctypes.data
    out.entropy = r["ent"].ctypes.data
    if grad:
        out.grad = r["grad"].ctypes.data
    out.n_counted, out.n_nonfinite = cnt.ctypes.data, cnt.ctypes.data + 8
    gr = None
    if grad_rows is not None:
        gr = np.ascontiguousarray(grad_rows, dtype=np.float64)
    C.LIB.call("xent_ce_f64", ctypes.byref(inp), ctypes.byref(opts),
               ctypes.c_void_p(None if gr is None else gr.ctypes.data),
               ctypes.byref(out))
    r["counted"], r["nonfinite"] = int(cnt[0]), int(cnt[1])
    return r


def check_rows(z, y, r, *, tau=1.0, eps=0.0, kz=0.0, grows=None,
               scale=1.0, what=""):
    """Every per-row output and gradient entry of r against the oracle;
    returns the worst error in ulps (faithful asserts it is < 1)."""
    worst = 0.0
    for i in range(z.shape[0]):
        t = None if y[i] < 0 else int(y[i])
        with decimal.localcontext(CTX):     # the exact upstream
            g = D(scale) * (D(1) if grows is None else D(float(grows[i])))
        o = oracle_row(list(z[i]), t, tau, eps, kz, g)
        assert o is not None, (what, i)
        checks = [("nll", r["nll"][i], o["nll"]),
                  ("logprob", -r["lp"][i], o["nll"]),
                  ("entropy", r["ent"][i], o["entropy"]),
                  ("loss", r["loss"][i], o["loss"])]
        # lse: faithful where it does not cancel (docs: L <= 2 |lse|)
        if abs(o["lse"]) * 2 >= o["lse"] - max(
                D(v) / D(tau) for v in z[i] if v != -INF):
            checks.append(("lse", r["lse"][i], o["lse"]))
        for name, got, X in checks:
            assert faithful(got, X), (what, i, name, got, str(X)[:40],
                                      ulp_err(got, X))
            worst = max(worst, ulp_err(got, X))
        if r["grad"] is None:
            continue
        G = abs(D(g) / D(tau))
        for j, X in enumerate(o["grad"]):
            got = r["grad"][i, j]
            if eps == 0:
                assert faithful(got, X), (what, i, j, got, str(X)[:40],
                                          ulp_err(got, X))
                worst = max(worst, ulp_err(got, X))
            else:
                # docs: |err| <= 2^-55 |g/tau| (a p_j + eps/V) + 1 ulp
                # (a p_j + eps/V <= |X|/|g/tau| + 2 eps/V; the target
                # entry: + 2 eps)
                sl = D(2) * D(eps) * (1 if j == t else D(1) / len(z[i]))
                bound = D(2) ** -55 * (abs(X) + G * sl) + D(
                    math.ulp(float(X)) if float(X) else 5e-324)
                assert abs(D(got) - X) <= bound, (what, i, j, got,
                                                  str(X)[:40])
    return worst


def _rand_rows(rng, T_, V, scale):
    return rng.standard_normal((T_, V)) * scale


@pytest.mark.parametrize("tau", [1.0, 0.7, 3.0])
def test_faithful_random_rows(rng, tau):
    worst = 0.0
    for trial in range(12):
        T_ = int(rng.integers(1, 5))
        V = int(rng.integers(1, 40))
        z = _rand_rows(rng, T_, V, 10 ** rng.uniform(-3, 2))
        y = rng.integers(0, V, T_)
        if T_ > 1:
            y[0] = -100
        r = run_c(z, y, tau=tau)
        worst = max(worst, check_rows(z, y, r, tau=tau, what="t%d" % trial))
    assert worst < 1.0
    print("worst %.3f ulp" % worst)


@pytest.mark.parametrize("margin", [-800, -300, -40, -5, 0, 5, 17, 40, 300,
                                    700, 745, 800])
def test_margins_subnormal_and_dead_zone(rng, margin):
    """The target `margin` nats above (below) the rest: nll down to
    subnormal, gradient entries down to subnormal, p_t - 1 tiny."""
    V = 33
    z = _rand_rows(rng, 3, V, 1.0)
    y = np.array([3, 17, 30])
    for i in range(3):
        z[i, y[i]] = z[i].max() + margin
    r = run_c(z, y)
    check_rows(z, y, r, what="margin %d" % margin)


@pytest.mark.parametrize("big", [3e3, 1e20, 1e300, 1.7e308])
def test_huge_logits(rng, big):
    V = 9
    rows = [np.full(V, big), np.full(V, -big),
            big * (1 + rng.integers(-3, 4, V) * 2.0 ** -52),
            np.where(rng.random(V) < 0.5, big, rng.standard_normal(V))]
    z = np.array(rows)
    y = np.array([0, 4, 8, 2])
    for tau in (1.0, 2.5):
        r = run_c(z, y, tau=tau)
        check_rows(z, y, r, tau=tau, what="big %g tau %g" % (big, tau))
    r = run_c(z[:1], y[:1])
    assert r["grad"][0, 1] == 1.0 / V and r["grad"][0, 0] == 1.0 / V - 1


@pytest.mark.parametrize("eps,kz", [(0.1, 0.0), (0.0, 1e-4), (0.3, 1e-3),
                                    (1.0, 0.0)])
def test_label_smoothing_and_z_loss(rng, eps, kz):
    for trial in range(6):
        V = int(rng.integers(2, 30))
        z = _rand_rows(rng, 3, V, 10 ** rng.uniform(-1, 1.5)) + 3.0
        y = rng.integers(0, V, 3)
        r = run_c(z, y, eps=eps, kz=kz)
        check_rows(z, y, r, eps=eps, kz=kz, what="eps %g kz %g" % (eps, kz))


def test_neg_inf_masking_and_nonfinite_rows():
    z = np.array([[0.5, -INF, 1.5, -2.0],      # a masked column
                  [-INF, 0.0, 1.0, 2.0],       # target masked: nll = +inf
                  [-INF, -INF, 3.0, -INF],     # one live column: the target
                  [-INF, -INF, -INF, -INF],    # all masked: NaN
                  [0.0, float("nan"), 1.0, 2.0],
                  [0.0, INF, 1.0, 2.0],
                  [-INF, -INF, -INF, -INF]])   # ignored, all masked
    y = np.array([2, 0, 2, 1, 0, 0, -100])
    r = run_c(z, y)
    assert r["nonfinite"] == 4 and r["counted"] == 6
    check_rows(z[:1], y[:1], {k: (v[:1] if isinstance(v, np.ndarray) else v)
                              for k, v in r.items()})
    assert r["nll"][1] == INF and r["lp"][1] == -INF and r["loss"][1] == INF
    assert r["grad"][1, 0] == -1.0 and np.isfinite(r["grad"][1]).all()
    np.testing.assert_allclose(r["grad"][1, 1:].sum(), 1.0, rtol=1e-15)
    assert r["nll"][2] == 0 and r["lse"][2] == 3.0 and r["ent"][2] == 0
    assert list(r["grad"][2]) == [0.0, 0.0, 0.0, 0.0]
    assert r["grad"][0, 1] == 0.0
    for i in (3, 4, 5):
        assert np.isnan(r["nll"][i]) and np.isnan(r["grad"][i]).all()
    assert r["loss"][6] == 0 and (r["grad"][6] == 0).all()


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_reductions_faithful(rng, reduction):
    T_, V = 40, 17
    z = _rand_rows(rng, T_, V, 4.0)
    z[::3] += np.arange(V) * 2.0      # a few confident rows
    y = rng.integers(0, V, T_)
    y[5] = y[11] = -100
    r = run_c(z, y, reduction=reduction, grad_scale=0.75)
    rows = [oracle_row(list(z[i]), None if y[i] < 0 else int(y[i]))
            for i in range(T_)]
    with decimal.localcontext(CTX):
        tot = sum((o["loss"] for o in rows), D(0))
    n = int((y >= 0).sum())
    X = tot if reduction == "sum" else CTX.divide(tot, D(n))
    assert faithful(r["loss"][0], X), (r["loss"][0], str(X)[:30])
    scale = D(0.75) if reduction == "sum" else CTX.divide(D(0.75), D(n))
    check_rows(z, y, {**r, "loss": np.array(
        [float(o["loss"]) for o in rows])}, scale=scale, what=reduction)


def test_grad_rows_double_and_strided_rows(rng):
    T_, V = 6, 21
    z = _rand_rows(rng, T_, V, 3.0)
    y = rng.integers(0, V, T_)
    gr = rng.standard_normal(T_) * 1e-3
    r = run_c(z, y, grad_rows=gr, ld=32)
    check_rows(z, y, r, grows=gr, what="grad_rows")
    # bitwise independent of the row stride and of the other rows
    r2 = run_c(z[2:3], y[2:3], grad_rows=gr[2:3])
    assert np.array_equal(r2["grad"][0], r["grad"][2])
    assert r2["nll"][0] == r["nll"][2]


def test_errors():
    z = np.zeros((2, 4))
    y = np.array([0, 1])
    with pytest.raises(xent.XentError, match="softcap"):
        inp = C.CeInput()
        inp.logits, inp.dtype, inp.T, inp.V = z.ctypes.data, C.F64, 2, 4
        inp.labels, inp.label_dtype = y.ctypes.data, C.I64
        opts = C.make_opts(softcap=30.0)
        C.LIB.call("xent_ce_f64", ctypes.byref(inp), ctypes.byref(opts),
                   None, ctypes.byref(C.CeOutputF64()))
    inp.dtype = C.F32
    with pytest.raises(xent.XentTypeError, match="f64"):
        C.LIB.call("xent_ce_f64", ctypes.byref(inp), None, None,
                   ctypes.byref(C.CeOutputF64()))
    inp.dtype = C.F64
    out = C.CeOutput()
    with pytest.raises(xent.XentTypeError, match="xent_ce_f64"):
        C.LIB.call("xent_ce", ctypes.byref(inp), None, ctypes.byref(out))


# --- the torch front ends ---------------------------------------------------


def _oracle_torch(z, y, reduction="mean", eps=0.0, ignore_index=-100):
    rows = [oracle_row(list(z[i]), None if y[i] == ignore_index
                       else int(y[i]), eps=eps) for i in range(len(z))]
    return rows


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_dropin_float64_is_faithful(rng, reduction, eps):
    T_, V = 7, 13
    zn = _rand_rows(rng, T_, V, 5.0)
    zn[1, 4] = zn[1].max() + 60.0           # a confident row
    zn[2, 3] = -INF                         # masking
    y = rng.integers(0, V, T_)
    y[0] = -100
    y[1] = 4
    z = torch.from_numpy(zn).requires_grad_(True)
    yt = torch.from_numpy(y)
    loss = XF.cross_entropy(z, yt, reduction=reduction, label_smoothing=eps)
    assert loss.dtype == torch.float64
    ref = F.cross_entropy(z.detach(), yt, reduction=reduction,
                          label_smoothing=eps)
    # torch's own float64 loses the confident row's nll (lse - z_t cancels)
    torch.testing.assert_close(loss.detach(), ref, rtol=1e-13, atol=1e-13)
    up = torch.linspace(0.5, 1.5, max(loss.numel(), 1),
                        dtype=torch.float64).reshape(loss.shape)
    g, = torch.autograd.grad(loss, z, up)
    rows = _oracle_torch(zn, y, eps=eps)
    n = int((y != -100).sum())
    if reduction == "none":
        for i in range(T_):
            assert faithful(float(loss[i]), rows[i]["loss"]), i
        grows = up.numpy()
        scale = D(1)
    else:
        with decimal.localcontext(CTX):
            tot = sum((o["loss"] for o in rows), D(0))
        X = tot if reduction == "sum" else CTX.divide(tot, D(n))
        if not X.is_infinite():
            assert faithful(float(loss.detach()), X)
        grows = None
        scale = D(float(up)) if reduction == "sum" else CTX.divide(
            D(float(up)), D(n))
    for i in range(T_):
        t = None if y[i] < 0 else int(y[i])
        gi = scale * (D(1) if grows is None else D(float(grows[i])))
        o = oracle_row(list(zn[i]), t, eps=eps, g=gi)
        for j in range(V):
            X = o["grad"][j]
            if eps == 0:
                assert faithful(float(g[i, j]), X), (i, j)
            else:
                assert abs(D(float(g[i, j])) - X) <= D(2) ** -52 * (
                    abs(X) + D(eps) * D(abs(gi)) / V) + D(5e-324), (i, j)


def test_xent_cross_entropy_and_logprobs_float64(rng):
    T_, V = 5, 11
    zn = _rand_rows(rng, T_, V, 3.0)
    y = rng.integers(0, V, T_)
    z = torch.from_numpy(zn).requires_grad_(True)
    yt = torch.from_numpy(y)
    loss = xent.cross_entropy(z, yt, reduction="sum", temperature=1.5,
                              z_loss=1e-4)
    loss.backward()
    assert loss.dtype == torch.float64 and z.grad.dtype == torch.float64
    for i in range(T_):
        o = oracle_row(list(zn[i]), int(y[i]), tau=1.5, kz=1e-4)
        for j in range(V):
            assert faithful(float(z.grad[i, j]), o["grad"][j]), (i, j)
    # a second backward from an upstream of 2 (not the fused gradient)
    z.grad = None
    loss = xent.cross_entropy(z, yt, reduction="none")
    loss.backward(torch.full((T_,), 2.0, dtype=torch.float64))
    for i in range(T_):
        o = oracle_row(list(zn[i]), int(y[i]), g=2.0)
        assert faithful(float(loss[i]), o["loss"])
        for j in range(V):
            assert faithful(float(z.grad[i, j]), o["grad"][j]), (i, j)
    lp, ent = xent.logprobs(z.detach(), yt, entropy=True)
    assert lp.dtype == torch.float64
    for i in range(T_):
        o = oracle_row(list(zn[i]), int(y[i]))
        assert faithful(-float(lp[i]), o["nll"])
        assert faithful(float(ent[i]), o["entropy"])


def test_dropin_float64_no_copy_of_strided_rows(rng):
    """Rows with a stride > V (a slice) go to the kernel as they are."""
    big = torch.from_numpy(_rand_rows(rng, 4, 20, 2.0))
    z = big[:, :15]
    y = torch.tensor([1, 2, 3, 14])
    prep = XT.Prepared(z, y, allow_f64=True)
    assert prep.ld == 20 and prep.inp.logits == z.data_ptr()
    a = XF.cross_entropy(z, y, reduction="none")
    b = XF.cross_entropy(z.contiguous(), y, reduction="none")
    assert torch.equal(a, b)


def test_dropin_float64_forward_ad_uses_composed_path():
    import torch.autograd.forward_ad as fwAD
    z = torch.randn(3, 5, dtype=torch.float64)
    y = torch.tensor([0, 1, 2])
    with fwAD.dual_level():
        d = fwAD.make_dual(z, torch.ones_like(z))
        out = XF.cross_entropy(d, y)
        assert fwAD.unpack_dual(out).tangent is not None


def test_dropin_float64_nan_rows_follow_torch():
    z = torch.tensor([[0.0, INF, 1.0], [0.5, 1.0, float("nan")],
                      [1.0, 2.0, 3.0]], dtype=torch.float64,
                     requires_grad=True)
    y = torch.tensor([0, 1, 2])
    a = XF.cross_entropy(z, y, reduction="none")
    b = F.cross_entropy(z.detach(), y, reduction="none")
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    torch.testing.assert_close(a, b, equal_nan=True)


def test_dropin_float64_compiles():
    crit = xent.nn.CrossEntropyLoss()
    z = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 1, 2, 3, 4, -100])
    eager = crit(z, y)
    c = torch.compile(lambda a, b: crit(a, b), fullgraph=True,
                      backend="aot_eager")
    comp = c(z, y)
    assert comp.dtype == torch.float64 and torch.equal(comp, eager)
    g1, = torch.autograd.grad(eager, z)
    g2, = torch.autograd.grad(comp, z)
    assert torch.equal(g1, g2)
