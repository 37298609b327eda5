#!/usr/bin/env python3
"""bench/python_vs_c.py: the Python call next to the C call it wraps, and
next to torch's, on the same tensors, in one run (issue 51).

For bf16 and fp32 logits [T, V] (default T = 2048, V = 128256; --small:
T = 512, V = 32000), 5% of the labels ignored (-100), reduction mean:

  fwd+bwd  C       xent_ce with the gradient (ctypes, same buffers, the
                   gradient buffer allocated once, as `xent bench`)
           C+alloc the same call writing a freshly allocated gradient (what
                   any autograd backward pays: the [T, V] result is new)
           py      xent.nn.functional.cross_entropy(x, y).backward()
           py-api  xent.cross_entropy(x, y).backward()   (python/xent/_torch.py)
           torch   torch.nn.functional.cross_entropy(x, y).backward()
  fwd      C       xent_logprobs (ctypes)
           py      xent.logprobs(z, y)
           py-ce   xent.nn.functional.cross_entropy(z, y) under no_grad
           torch   log_softmax(z).gather(y)   (fwd only)
           torch-ce torch's F.cross_entropy under no_grad

Every case of one dtype runs once per repetition, in turn (interleaved), so a
load change on a shared machine hits them alike; the table shows the median
of --reps and each time over the C call's. xent's calls all run with the
same thread count (--threads, default xent's: all the cores this process
may use), passed to the C call as opts.threads and to the Python calls as
the process default (xent.set_num_threads); torch.set_num_threads gets it
too. --last-line prints one parseable line per dtype for bench/run_cpu.sh.
"""
import argparse
import ctypes
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
if "XENT_LIBRARY" not in os.environ:
    for cand in (HERE.parent / "build" / "libxent.so",):
        if cand.is_file():
            os.environ["XENT_LIBRARY"] = str(cand)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import xent  # noqa: E402
import xent.nn.functional as XF  # noqa: E402
from xent import _capi as C  # noqa: E402
from torch_anchor import interleaved  # noqa: E402

_XDT = {torch.float32: C.F32, torch.bfloat16: C.BF16}


def inputs(T, V, seed=1):
    g = torch.Generator().manual_seed(seed)
    z32 = (torch.rand(T, V, generator=g) * 4 - 2) * 3.5
    y = torch.randint(0, V, (T,), generator=g)
    y[torch.rand(T, generator=g) < 0.05] = -100
    return z32, y


class CCall:
    """xent_ce / xent_logprobs through ctypes on the given tensors."""

    def __init__(self, z, y, threads):
        self.z, self.y = z, y
        T, V = z.shape
        self.inp = C.CeInput()
        self.inp.logits = z.data_ptr()
        self.inp.dtype = _XDT[z.dtype]
        self.inp.T, self.inp.V, self.inp.ld = T, V, V
        self.inp.labels = y.data_ptr()
        self.inp.label_dtype = C.I64
        self.opts = C.make_opts(reduction="mean", threads=threads)
        self.loss = torch.empty(1)
        self.lp = torch.empty(T)
        self.grad = torch.zeros_like(z)        # faulted in once
        self.fn_ce = C.LIB.fn("xent_ce")
        self.fn_lp = C.LIB.fn("xent_logprobs")

    def ce(self, grad=None):
        g = self.grad if grad is None else grad
        out = C.CeOutput()
        out.loss = self.loss.data_ptr()
        out.grad = g.data_ptr()
        out.grad_dtype = self.inp.dtype
        out.ld_grad = self.inp.V
        st = self.fn_ce(ctypes.byref(self.inp), ctypes.byref(self.opts),
                        ctypes.byref(out))
        if st:
            raise C.error_from_status(st, "xent_ce")
        return g

    def ce_alloc(self):
        return self.ce(torch.empty_like(self.z))

    def logprobs(self):
        st = self.fn_lp(ctypes.byref(self.inp), ctypes.byref(self.opts),
                        ctypes.c_void_p(self.lp.data_ptr()), None)
        if st:
            raise C.error_from_status(st, "xent_logprobs")
        return self.lp


def cases(z, y, threads):
    c = CCall(z, y, threads)

    def py_fb():
        x = z.detach().requires_grad_(True)
        XF.cross_entropy(x, y).backward()
        return x.grad

    def api_fb():
        x = z.detach().requires_grad_(True)
        xent.cross_entropy(x, y).backward()
        return x.grad

    def torch_fb():
        x = z.detach().requires_grad_(True)
        F.cross_entropy(x, y).backward()
        return x.grad

    def py_lp():
        return xent.logprobs(z, y)

    def py_ce_fwd():
        with torch.no_grad():
            return XF.cross_entropy(z, y)

    def torch_lp():
        with torch.no_grad():
            return torch.log_softmax(z, dim=-1).gather(
                1, y.clamp(min=0)[:, None])

    def torch_ce_fwd():
        with torch.no_grad():
            return F.cross_entropy(z, y)

    fb = [("C", c.ce), ("C+alloc", c.ce_alloc), ("py", py_fb),
          ("py-api", api_fb), ("torch", torch_fb)]
    fw = [("C", c.logprobs), ("py", py_lp), ("py-ce", py_ce_fwd),
          ("torch", torch_lp), ("torch-ce", torch_ce_fwd)]
    return [("fwd+bwd", n, f) for n, f in fb] + \
        [("fwd", n, f) for n, f in fw]


def check_same(z, y, threads):
    """The Python paths give the C call's bits (loss and gradient)."""
    c = CCall(z, y, threads)
    g_c = c.ce().clone()
    loss_c = float(c.loss[0])
    x = z.detach().requires_grad_(True)
    loss = XF.cross_entropy(x, y)
    loss.backward()
    # the drop-in returns the loss in the logits' dtype, as torch does
    want = torch.tensor(loss_c).to(z.dtype)
    ok = torch.equal(loss.detach(), want) and torch.equal(x.grad, g_c)
    lp = xent.logprobs(z, y)
    ok = ok and torch.equal(lp, c.logprobs())
    return ok


def run(dt, z32, y, reps, threads):
    """Median time of each case, the cases interleaved (torch_anchor's
    interleaved: one warm-up round, each call's outputs dropped before the
    next), and whether the Python and C outputs have the same bits."""
    z = z32.to(dt)
    todo = cases(z, y, threads)
    stats = interleaved([f for _, _, f in todo], reps)
    same = check_same(z, y, threads)
    return {(k, n): st[0] for (k, n, _), st in zip(todo, stats)}, same


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--V", type=int, default=128256)
    ap.add_argument("--small", action="store_true",
                    help="T = 512, V = 32000")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0,
                    help="0: xent's default (the cores this process may use)")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--last-line", action="store_true",
                    help="also print '# py ...' lines for bench/run_cpu.sh")
    a = ap.parse_args(argv)
    if a.small:
        a.T, a.V = 512, 32000
    th = a.threads or C.num_threads(0)
    xent.set_num_threads(th)
    torch.set_num_threads(th)
    dts = {"bf16": torch.bfloat16, "fp32": torch.float32}
    z32, y = inputs(a.T, a.V)
    print("python_vs_c: T = %d, V = %d, reduction mean, %d%% ignored, "
          "%d thread%s (xent %d, torch %d), median of %d, interleaved"
          % (a.T, a.V, round(100 * float((y == -100).float().mean())), th,
             "s" if th > 1 else "", C.num_threads(0),
             torch.get_num_threads(), a.reps))
    print("libxent %s (%s); torch %s; load %s" % (
        xent.version(), xent.library_path(), torch.__version__,
        " ".join("%.2f" % v for v in os.getloadavg())))
    print("%-5s %-8s %-9s %10s %9s" % ("dtype", "pass", "call", "ms",
                                        "x C"))
    summary = []
    for name in a.dtypes.split(","):
        dt = dts[name]
        med, same = run(dt, z32, y, a.reps, th)
        for (k, n), t in med.items():
            print("%-5s %-8s %-9s %10.1f %9.2f" % (name, k, n, 1e3 * t,
                                                   t / med[(k, "C")]))
        print("%-5s python == C bits (loss, grad, logprobs): %s"
              % (name, "yes" if same else "NO"))
        summary.append((name, med))
    for name, med in summary:
        print("%s: py/C fwd+bwd %.2f (py-api %.2f), fwd %.2f (py-ce %.2f); "
              "torch/C fwd+bwd %.2f, fwd %.2f" % (
                  name, med[("fwd+bwd", "py")] / med[("fwd+bwd", "C")],
                  med[("fwd+bwd", "py-api")] / med[("fwd+bwd", "C")],
                  med[("fwd", "py")] / med[("fwd", "C")],
                  med[("fwd", "py-ce")] / med[("fwd", "C")],
                  med[("fwd+bwd", "torch")] / med[("fwd+bwd", "C")],
                  med[("fwd", "torch")] / med[("fwd", "C")]))
    if len(summary) == 2:
        b, f = summary[0][1], summary[1][1]
        print("bf16/fp32 time: py fwd+bwd %.2f, py fwd %.2f; C fwd+bwd %.2f, "
              "C fwd %.2f" % (b[("fwd+bwd", "py")] / f[("fwd+bwd", "py")],
                              b[("fwd", "py")] / f[("fwd", "py")],
                              b[("fwd+bwd", "C")] / f[("fwd+bwd", "C")],
                              b[("fwd", "C")] / f[("fwd", "C")]))
    if a.last_line:
        for name, med in summary:
            print("# py dtype=%s threads=%d %s" % (name, th, " ".join(
                "%s:%s=%.6e" % (k, n, t) for (k, n), t in med.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
