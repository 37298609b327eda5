#!/usr/bin/env python3
"""bench/cuda_linear_ce_bench.py: xent's fused LM head + cross-entropy beside its peers, in one run.

Loads build/libxent.so (built by `make`; this script builds nothing) and
times, on the same inputs (hidden [T, H] and weight [V, H] in bf16, int64
labels with 5% ignored, loss mean):
  - forward + backward (gradients of hidden and weight):
      xent through ctypes with the gradients and the workspace allocated
      beforehand (the library call alone), the same with label checking
      off, xent through the Python binding (xent.linear_cross_entropy and
      torch.autograd.grad), unfused PyTorch (bf16 logits = hidden @ weight.T,
      F.cross_entropy(logits.float(), labels)), Liger-Kernel's
      LigerFusedLinearCrossEntropyLoss and Cut Cross-Entropy's
      linear_cross_entropy (each when importable);
  - forward only, per-token log-probabilities: xent_cuda_linear_logprobs
    (ctypes, output and workspace allocated beforehand) and PyTorch (bf16
    matmul, then float log_softmax + gather).
Time: median of --reps (default 10) after --warmup (default 3) runs, CUDA
events around each call. Extra memory: peak allocated by torch's allocator
during one more call beyond what was allocated before it (inputs and
pre-allocated outputs), minus the gradients it returns (so that every row
counts scratch only); for the ctypes rows, plus the workspace they were
given (allocated beforehand, so not seen by the peak).
Rates: the bf16 matrix rate is measured in the same run (torch.matmul
8192^3 bf16). Forward + backward rows give TFLOP/s counted as 6*T*H*V/time
(the three products a fused head must do: logits, dhidden, dweight) and as
8*T*H*V/time (a convention that also counts recomputing the logits), each with its fraction of the
measured matrix rate; forward-only rows count 2*T*H*V.
Correctness, per shape: xent's loss against a float64 reference computed
from the same bf16 inputs (logits = hidden.double() @ weight.double().T, in
chunks of rows), and against unfused PyTorch; the gradients' relative L2
difference from unfused PyTorch's (which rounds logits to bf16: a loose
cross-check, not a reference).

Usage: python3 bench/cuda_linear_ce_bench.py [--shapes 16384x4096x128256,8192x2048x151936]
       [--reps 10] [--warmup 3] [--lib build/libxent.so] [--json FILE] [--chunk-rows 0]
       [--no-peers]
"""
import argparse
import ctypes
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--shapes", default="16384x4096x128256,8192x2048x151936",
                    help="comma-separated TxHxV list (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=10, help="timed runs (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    ap.add_argument("--lib", default="build/libxent.so",
                    help="library (default build/libxent.so)")
    ap.add_argument("--json", default=None, help="also write the results here (default: none)")
    ap.add_argument("--chunk-rows", type=int, default=0,
                    help="xent rows per chunk (default 0: the library's default)")
    ap.add_argument("--no-peers", action="store_true",
                    help="xent only, no peers and no reference loss (default: all)")
    return ap.parse_args()


ARGS = parse_args() if __name__ == "__main__" else None

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def load_binding(lib):
    """The xent package of this checkout, bound to `lib`."""
    path = pathlib.Path(lib)
    if not path.is_file() and (ROOT / lib).is_file():
        path = ROOT / lib                   # relative to the checkout
    os.environ["XENT_LIBRARY"] = str(path.resolve())
    sys.path.insert(0, str(ROOT / "python"))
    import xent
    from xent import _capi, _linear
    if not _linear.available():
        sys.exit(f"{lib}: no CUDA fused LM head (xent_cuda_linear_ce), or no GPU "
                 f"(library: {_capi.version()})")
    bad = xent.abi_mismatches()
    if bad:
        sys.exit(f"{lib}: ctypes mirrors do not match the library: {'; '.join(bad)}")
    return xent, _capi


# --------------------------------------------------------------- timing --
from cuda_ce_bench import time_it  # noqa: E402  (median and min ms, CUDA events)


def extra_mem(fn, returned_bytes=0):
    """Peak bytes allocated by torch's allocator during fn() beyond what was
    allocated before it, minus returned_bytes (the gradients fn returns)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    r = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del r
    return max(0, peak - base - returned_bytes)


def matrix_rate(n=8192, reps=20):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms, best = time_it(lambda: torch.matmul(a, b), reps, 5)
    return 2 * n ** 3 / (ms * 1e-3), 2 * n ** 3 / (best * 1e-3)


def ref_nll_f64(hidden, weight, labels, ignore=-100, rows=1024):
    """Per-row NLL [T] (0 on ignored rows) and the mean NLL, in float64 from
    the same bf16 inputs, rows at a time."""
    wd = weight.double()
    nll = torch.zeros(hidden.shape[0], device=hidden.device, dtype=torch.float64)
    for i in range(0, hidden.shape[0], rows):
        z = hidden[i:i + rows].double() @ wd.T
        y = labels[i:i + rows]
        lse = torch.logsumexp(z, 1)
        zt = z.gather(1, y.clamp(min=0)[:, None])[:, 0]
        nll[i:i + rows] = torch.where(y != ignore, lse - zt, torch.zeros_like(lse))
        del z
    del wd
    n = int((labels != ignore).sum())
    return nll, nll.sum().item() / max(n, 1)


# ------------------------------------------------------------------ main --
def bench_shape(args, xent, C, T, H, V, mm_rate, peers, rows, checks):
    """Times every row at one shape; appends to rows and checks."""
    LIB = C.LIB
    liger_cls, cce_fn = peers
    stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)  # noqa: E731
    tag = f"{T}x{H}x{V}"
    flops = T * H * V
    # logits of standard deviation ~2 nats
    hidden = torch.randn(T, H, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    weight = (torch.randn(V, H, device="cuda", dtype=torch.float32)
              * (2.0 / H ** 0.5)).to(torch.bfloat16)
    labels = torch.randint(0, V, (T,), device="cuda", dtype=torch.int64)
    labels[torch.rand(T, device="cuda") < 0.05] = -100
    grad_bytes = (T * H + V * H) * 2

    def add(kind, name, ms, extra, loss=None):
        if kind == "fwd+bwd":
            r6, r8 = 6 * flops / (ms * 1e-3), 8 * flops / (ms * 1e-3)
        else:
            r6, r8 = 2 * flops / (ms * 1e-3), None
        rows.append(dict(shape=tag, kind=kind, impl=name, ms=ms,
                         extra_gib=None if extra is None else extra / 2**30,
                         tflops_6=r6 / 1e12 if kind == "fwd+bwd" else None,
                         tflops_2=r6 / 1e12 if kind != "fwd+bwd" else None,
                         tflops_8=None if r8 is None else r8 / 1e12,
                         frac=r6 / mm_rate, frac_8=None if r8 is None else r8 / mm_rate,
                         loss=loss))
        rate = (f"6THV {r6 / 1e12:6.1f} TFLOP/s ({100 * r6 / mm_rate:4.1f}% of mm), "
                f"8THV {r8 / 1e12:6.1f} TFLOP/s ({100 * r8 / mm_rate:4.1f}%)"
                if r8 is not None else
                f"2THV {r6 / 1e12:6.1f} TFLOP/s ({100 * r6 / mm_rate:4.1f}% of mm)")
        print(f"  {tag} {kind:8s} {name:36s} {ms:9.3f} ms  "
              f"{'' if extra is None else f'+{extra / 2**30:6.3f} GiB'}  {rate}"
              + ("" if loss is None else f"  loss {loss:.7f}"), flush=True)

    # ---- xent through ctypes: gradients and workspace allocated before
    inp = C.LinearInput()
    inp.hidden, inp.weight, inp.bias = hidden.data_ptr(), weight.data_ptr(), None
    inp.dtype, inp.T, inp.H, inp.V = C.BF16, T, H, V
    inp.labels, inp.label_dtype, inp.grad_rows = labels.data_ptr(), C.I64, None
    gh = torch.empty_like(hidden)
    gw = torch.empty_like(weight)
    grads = C.LinearGrads()
    grads.hidden, grads.hidden_dtype = gh.data_ptr(), C.BF16
    grads.weight, grads.weight_dtype = gw.data_ptr(), C.BF16
    grads.bias, grads.bias_dtype, grads.accumulate = None, C.BF16, 0
    ws_bytes = LIB.fn("xent_cuda_linear_workspace")(
        ctypes.byref(inp), ctypes.byref(grads), ctypes.c_int64(args.chunk_rows))
    bufs = dict(ws=torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda"))
    loss_buf = torch.empty(1, device="cuda", dtype=torch.float32)
    opts = C.make_opts(reduction="mean")
    out = C.CeOutput()
    out.loss = loss_buf.data_ptr()
    print(f"  {tag} xent workspace {ws_bytes / 2**30:.3f} GiB (chunk_rows "
          f"{args.chunk_rows or 'default'})")

    def xent_ctypes():
        LIB.call("xent_cuda_linear_ce", ctypes.byref(inp), ctypes.byref(opts),
                 ctypes.byref(out), ctypes.byref(grads), ctypes.c_void_p(bufs["ws"].data_ptr()),
                 ctypes.c_size_t(ws_bytes), stream())

    ms, _ = time_it(xent_ctypes, args.reps, args.warmup)
    xent_loss = loss_buf.item()
    add("fwd+bwd", "xent (ctypes, preallocated)", ms, extra_mem(xent_ctypes) + ws_bytes,
        loss=xent_loss)
    check = LIB.fn("xent_cuda_set_label_check")
    old = check(0)
    ms, _ = time_it(xent_ctypes, args.reps, args.warmup)
    check(old)
    add("fwd+bwd", "xent (ctypes, label check off)", ms, None)
    bufs.clear()
    # variants: an fp32 weight-gradient buffer (the caller's main_grad: no
    # fp32 accumulator in the workspace) and a larger chunk
    gw32 = torch.empty(V, H, device="cuda", dtype=torch.float32)
    for cr in [args.chunk_rows] + ([1024, 4096] if args.chunk_rows == 0 else []):
        for wdt in ("bf16", "f32"):
            if cr == args.chunk_rows and wdt == "bf16":
                continue
            g2 = C.LinearGrads()
            g2.hidden, g2.hidden_dtype = gh.data_ptr(), C.BF16
            g2.weight, g2.weight_dtype = ((gw32.data_ptr(), C.F32) if wdt == "f32"
                                          else (gw.data_ptr(), C.BF16))
            g2.bias, g2.bias_dtype, g2.accumulate = None, C.BF16, 0
            nb = LIB.fn("xent_cuda_linear_workspace")(
                ctypes.byref(inp), ctypes.byref(g2), ctypes.c_int64(cr))
            ws2 = torch.empty(max(nb, 1), dtype=torch.uint8, device="cuda")

            def xent_var(g2=g2, ws2=ws2, nb=nb):
                LIB.call("xent_cuda_linear_ce", ctypes.byref(inp), ctypes.byref(opts),
                         ctypes.byref(out), ctypes.byref(g2), ctypes.c_void_p(ws2.data_ptr()),
                         ctypes.c_size_t(nb), stream())

            ms, _ = time_it(xent_var, args.reps, args.warmup)
            add("fwd+bwd", f"xent (ctypes, {wdt} dW, chunk {cr or 'default'})", ms,
                extra_mem(xent_var) + nb, loss=loss_buf.item())
            del ws2, xent_var
    del gw32
    bufs["ws"] = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")
    xent_ctypes()
    torch.cuda.synchronize()
    xent_gh, xent_gw = gh, gw
    bufs.clear()                # the workspace

    # ---- xent through the Python binding (autograd)
    def xent_autograd():
        h = hidden.detach().requires_grad_(True)
        w = weight.detach().requires_grad_(True)
        loss = xent.linear_cross_entropy(h, w, labels, chunk_rows=args.chunk_rows)
        return torch.autograd.grad(loss, (h, w))

    ms, _ = time_it(xent_autograd, args.reps, args.warmup)
    add("fwd+bwd", "xent.linear_cross_entropy (autograd)", ms,
        extra_mem(xent_autograd, grad_bytes))

    if not args.no_peers:
        ref_nll, ref = ref_nll_f64(hidden, weight, labels)
        torch.cuda.empty_cache()

        def unfused(ret_loss=False):
            h = hidden.detach().requires_grad_(True)
            w = weight.detach().requires_grad_(True)
            loss = F.cross_entropy((h @ w.T).float(), labels)
            g = torch.autograd.grad(loss, (h, w))
            return (loss.detach(), g) if ret_loss else g

        tl, (tgh, tgw) = unfused(True)
        tl = tl.item()
        rgh = ((xent_gh.float() - tgh.float()).norm() / tgh.float().norm()).item()
        rgw = ((xent_gw.float() - tgw.float()).norm() / tgw.float().norm()).item()
        del tgh, tgw
        line = (f"{tag} loss: xent {xent_loss:.9f}, float64 reference {ref:.9f} "
                f"(rel {abs(xent_loss - ref) / abs(ref):.2e}), unfused torch {tl:.9f} "
                f"(rel {abs(xent_loss - tl) / abs(tl):.2e}); gradients vs unfused torch: "
                f"rel L2 hidden {rgh:.2e}, weight {rgw:.2e}")
        print("  " + line, flush=True)
        checks.append(dict(shape=tag, xent=xent_loss, ref_f64=ref, torch=tl,
                           rel_ref=abs(xent_loss - ref) / abs(ref),
                           rel_torch=abs(xent_loss - tl) / abs(tl),
                           grad_rel_hidden_vs_torch=rgh, grad_rel_weight_vs_torch=rgw))
        ms, _ = time_it(unfused, args.reps, args.warmup)
        add("fwd+bwd", "torch unfused (bf16 mm, fp32 CE)", ms, extra_mem(unfused, grad_bytes),
            loss=tl)
        torch.cuda.empty_cache()
        if liger_cls is not None:
            lce = liger_cls(ignore_index=-100, reduction="mean")

            def liger(ret_loss=False):
                h = hidden.detach().requires_grad_(True)
                w = weight.detach().requires_grad_(True)
                loss = lce(w, h, labels)
                g = torch.autograd.grad(loss, (h, w))
                return (loss.detach(), g) if ret_loss else g
            ll = liger(True)[0].item()
            ms, _ = time_it(liger, args.reps, args.warmup)
            add("fwd+bwd", "Liger fused linear CE", ms, extra_mem(liger, grad_bytes), loss=ll)
            torch.cuda.empty_cache()
        if cce_fn is not None:
            def cce(ret_loss=False):
                h = hidden.detach().requires_grad_(True)
                w = weight.detach().requires_grad_(True)
                loss = cce_fn(h, w, labels, ignore_index=-100)
                g = torch.autograd.grad(loss, (h, w))
                return (loss.detach(), g) if ret_loss else g
            cl = cce(True)[0].item()
            ms, _ = time_it(cce, args.reps, args.warmup)
            add("fwd+bwd", "Cut Cross-Entropy", ms, extra_mem(cce, grad_bytes), loss=cl)
            torch.cuda.empty_cache()

    # ---- forward only: per-token log-probabilities
    lp = torch.empty(T, device="cuda", dtype=torch.float32)
    lws_bytes = LIB.fn("xent_cuda_linear_workspace")(
        ctypes.byref(inp), None, ctypes.c_int64(args.chunk_rows))
    lws = torch.empty(max(lws_bytes, 1), dtype=torch.uint8, device="cuda")
    lopts = C.make_opts(reduction="none")

    def xent_lp():
        LIB.call("xent_cuda_linear_logprobs", ctypes.byref(inp), ctypes.byref(lopts),
                 ctypes.c_void_p(lp.data_ptr()), None, ctypes.c_void_p(lws.data_ptr()),
                 ctypes.c_size_t(lws_bytes), stream())

    ms, _ = time_it(xent_lp, args.reps, args.warmup)
    add("logprobs", "xent_cuda_linear_logprobs (ctypes)", ms, extra_mem(xent_lp) + lws_bytes)
    if not args.no_peers:
        def torch_lp():
            with torch.no_grad():
                z = hidden @ weight.T
                return torch.log_softmax(z.float(), -1).gather(
                    1, labels.clamp(min=0)[:, None])[:, 0]
        ref_lp = torch_lp()
        valid = labels != -100
        d = (lp - ref_lp)[valid].abs()
        print(f"  {tag} logprobs vs torch (bf16 logits): max |diff| {d.max().item():.3e}, "
              f"mean {d.mean().item():.3e} nats", flush=True)
        valid = labels != -100
        r = ((lp.double() + ref_nll).abs() / ref_nll)[valid]
        print(f"  {tag} logprobs vs float64 reference: max rel {r.max().item():.2e}, "
              f"mean rel {r.mean().item():.2e}", flush=True)
        del ref_lp, ref_nll
        ms, _ = time_it(torch_lp, args.reps, args.warmup)
        add("logprobs", "torch (bf16 mm, fp32 log_softmax)", ms, extra_mem(torch_lp, 4 * T))


def main(args):
    xent, C = load_binding(args.lib)
    LIB = C.LIB
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    mm_rate, mm_best = matrix_rate()
    print(f"device {dev}; torch {torch.__version__}; library {C.version()} ({LIB.path})")
    print(f"bf16 matrix rate (torch.matmul 8192^3): {mm_rate / 1e12:.1f} TFLOP/s median, "
          f"{mm_best / 1e12:.1f} best")
    liger_cls = cce_fn = None
    if not args.no_peers:
        try:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss as liger_cls
        except Exception as e:  # noqa: BLE001
            print(f"Liger-Kernel not importable ({e}): its rows are skipped")
        try:
            from cut_cross_entropy import linear_cross_entropy as cce_fn
        except Exception as e:  # noqa: BLE001
            print(f"Cut Cross-Entropy not importable ({e}): its rows are skipped")

    rows, checks = [], []
    for shape in args.shapes.split(","):
        T, H, V = (int(s) for s in shape.split("x"))
        bench_shape(args, xent, C, T, H, V, mm_rate, (liger_cls, cce_fn), rows, checks)
        torch.cuda.empty_cache()
    print()
    print(f"bf16 matrix rate measured in this run: {mm_rate / 1e12:.1f} TFLOP/s (8192^3). "
          f"Forward+backward rates: 6*T*H*V/time and 8*T*H*V/time (counting a recomputation of the logits); "
          f"logprobs: 2*T*H*V/time.")
    print()
    print("| T, H, V | kind | implementation | time (ms) | extra memory | TFLOP/s 6THV "
          "| % mm | TFLOP/s 8THV | % mm |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ex = "" if r["extra_gib"] is None else (
            f"{r['extra_gib'] * 2**10:.1f} MiB" if r["extra_gib"] < 0.1
            else f"{r['extra_gib']:.2f} GiB")
        t6 = r["tflops_6"] if r["tflops_6"] is not None else r["tflops_2"]
        lab = "" if r["tflops_6"] is not None else " (2THV)"
        t8 = "" if r["tflops_8"] is None else f"{r['tflops_8']:.1f}"
        f8 = "" if r["frac_8"] is None else f"{100 * r['frac_8']:.1f}%"
        print(f"| {r['shape'].replace('x', ', ')} | {r['kind']} | {r['impl']} | {r['ms']:.2f} | "
              f"{ex} | {t6:.1f}{lab} | {100 * r['frac']:.1f}% | {t8} | {f8} |")
    for c in checks:
        print(f"\n{c['shape']}: loss rel diff vs float64 reference {c['rel_ref']:.2e}, "
              f"vs unfused torch {c['rel_torch']:.2e}", end="")
    print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev, torch=torch.__version__, library=C.version(),
                           matrix_tflops=mm_rate / 1e12, matrix_tflops_best=mm_best / 1e12,
                           chunk_rows=args.chunk_rows, reps=args.reps, warmup=args.warmup,
                           date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           rows=rows, checks=checks), f, indent=1)


if __name__ == "__main__":
    main(ARGS)
