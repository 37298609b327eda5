#!/usr/bin/env python3
"""bench/cuda_ce_bench.py: xent's CUDA cross-entropy beside its peers, in one run.

Loads build/libxent.so (built by `make`; this script builds nothing) through
ctypes and times, on the same inputs (bf16 logits, int64 labels with 5%
ignored, loss mean):
  - forward + backward: xent (separate gradient buffer, in place, and with
    label checking off), PyTorch eager F.cross_entropy on bf16 and on
    .float() logits, torch.compile of the latter, Liger-Kernel's
    cross-entropy (when importable);
  - forward-only per-token log-probabilities: xent_cuda_logprobs, torch
    F.cross_entropy(reduction='none') on bf16, fp32 log_softmax + gather,
    torch.compile of it, Liger without gradient.
Time: median of --reps (default 20) after --warmup (default 3) runs, CUDA
events around each call. xent's calls of a shape are timed interleaved,
one of each a round in a rotating order, so that drift over the run
reaches them alike: the three with a gradient (buffer, buffer without the
label check, in place) together, then the two forward-only (with and
without the check); the peers one after another. Floor: 4*T*V
bytes (one bf16 read + one bf16 write) at the device copy bandwidth
measured in this run; forward-only:
2*T*V bytes at the read bandwidth measured in this run (the faster of
torch's sum and a plain Triton read kernel over 4 GiB; both printed). Extra memory: peak
allocated by the call beyond its inputs and its gradient (torch's allocator;
xent's scratch, from its own stream-ordered pool, is reported by
construction: with a gradient and a reduced loss, 16 + 576 bytes a call
whatever T; forward-only, 16 bytes a row plus 16).

Usage: python3 bench/cuda_ce_bench.py [--shapes 16384x128256,8192x151936,32768x32000]
       [--reps 20] [--warmup 3] [--lib build/libxent.so] [--json FILE] [--no-compile]
       [--no-peers] [--exact] [--variants kernel=1,kernel=2+onchip_blocks=4,...]
(--exact: xent in exact mode too, in place and forward-only; a variant times
xent again under that kernel plan (fields of xent_cuda_plan, include/xent/cuda.h,
joined by +): forward + backward into the gradient buffer and in place, and
forward-only; e.g. the streaming kernel forced, or the on-chip kernel with
clusters of 4 blocks)
"""
import argparse
import ctypes as C
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------- ctypes --
XENT_F32, XENT_BF16, XENT_F16, XENT_I64 = 0, 1, 2, 5
REDUCE_NONE, REDUCE_SUM, REDUCE_MEAN = 0, 1, 2


class Plan(C.Structure):
    _fields_ = [("kernel", C.c_int32), ("block", C.c_int32), ("stage_bytes", C.c_int32),
                ("onchip_blocks", C.c_int32), ("onchip_threads", C.c_int32),
                ("onchip_groups", C.c_int32), ("linear_rows", C.c_int64)]


def set_plan(lib, spec):
    """Sets the calling thread's kernel plan from "field=value[+field=value]"
    ("" or None: the default plan)."""
    plan = Plan()
    for kv in filter(None, (spec or "").split("+")):
        name, value = kv.split("=", 1)
        if name not in dict(Plan._fields_):
            raise SystemExit(f"unknown plan field '{name}' (fields: "
                             f"{', '.join(f for f, _ in Plan._fields_)})")
        setattr(plan, name, int(value))
    if not hasattr(lib, "xent_cuda_set_plan"):
        if spec:
            raise SystemExit(f"plan {spec}: this build has no xent_cuda_set_plan")
        return
    if lib.xent_cuda_set_plan(C.byref(plan), None) != 0:
        raise SystemExit(f"plan {spec}: {lib.xent_last_error().decode()}")


class Input(C.Structure):
    _fields_ = [("logits", C.c_void_p), ("dtype", C.c_int), ("T", C.c_int64),
                ("V", C.c_int64), ("ld", C.c_int64), ("labels", C.c_void_p),
                ("label_dtype", C.c_int), ("grad_rows", C.c_void_p)]


class Opts(C.Structure):
    _fields_ = [("ignore_index", C.c_int64), ("reduction", C.c_int),
                ("normalizer", C.c_double), ("temperature", C.c_double),
                ("softcap", C.c_double), ("z_loss", C.c_double),
                ("label_smoothing", C.c_double), ("grad_scale", C.c_double),
                ("vocab_start", C.c_int64), ("vocab_total", C.c_int64),
                ("threads", C.c_int)]


class Output(C.Structure):
    _fields_ = [("loss", C.c_void_p), ("nll", C.c_void_p), ("logprob", C.c_void_p),
                ("lse", C.c_void_p), ("entropy", C.c_void_p), ("stats", C.c_void_p),
                ("grad", C.c_void_p), ("grad_dtype", C.c_int), ("ld_grad", C.c_int64),
                ("n_counted", C.c_void_p), ("n_nonfinite", C.c_void_p)]


def load_lib(path):
    lib = C.CDLL(path)
    for name in ("xent_cuda_ce", "xent_cuda_logprobs"):
        getattr(lib, name).restype = C.c_int
    lib.xent_cuda_ce.argtypes = [C.POINTER(Input), C.POINTER(Opts), C.POINTER(Output), C.c_void_p]
    lib.xent_cuda_logprobs.argtypes = [C.POINTER(Input), C.POINTER(Opts), C.c_void_p,
                                       C.c_void_p, C.c_void_p]
    lib.xent_last_error.restype = C.c_char_p
    lib.xent_cuda_set_label_check.restype = C.c_int
    lib.xent_cuda_set_label_check.argtypes = [C.c_int]
    if hasattr(lib, "xent_cuda_set_exact"):  # (builds before exact mode lack it)
        lib.xent_cuda_set_exact.restype = C.c_int
        lib.xent_cuda_set_exact.argtypes = [C.c_int]
    if hasattr(lib, "xent_cuda_set_plan"):  # (builds before the kernel plan lack it)
        lib.xent_cuda_set_plan.restype = C.c_int
        lib.xent_cuda_set_plan.argtypes = [C.POINTER(Plan), C.c_void_p]
    if hasattr(lib, "xent_abi_sizeof"):
        lib.xent_abi_sizeof.restype = C.c_size_t
        lib.xent_abi_sizeof.argtypes = [C.c_char_p]
        for cls, name in ((Input, b"xent_ce_input"), (Opts, b"xent_ce_opts"),
                          (Output, b"xent_ce_output")):
            n = lib.xent_abi_sizeof(name)
            if n != C.sizeof(cls) and n != C.c_size_t(-1).value:
                sys.exit(f"ABI mismatch: sizeof {name.decode()} is {n}, ctypes has {C.sizeof(cls)}")
    return lib


def default_opts():
    return Opts(ignore_index=-100, reduction=REDUCE_MEAN, normalizer=0.0, temperature=1.0,
                softcap=0.0, z_loss=0.0, label_smoothing=0.0, grad_scale=1.0,
                vocab_start=0, vocab_total=0, threads=0)


# --------------------------------------------------------------- timing --
def timed_call(fn, before=None):
    """ms of one fn() on the GPU (CUDA events), after before() untimed."""
    if before: before()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def time_it(fn, reps, warmup, before=None):
    """Median and min ms of fn() over reps runs (CUDA events), after warmup
    runs. before(): untimed setup run before each call (e.g. restoring
    inputs)."""
    for _ in range(warmup):
        if before: before()
        fn()
    torch.cuda.synchronize()
    times = [timed_call(fn, before) for _ in range(reps)]
    return statistics.median(times), min(times)


def time_interleaved(cases, reps, warmup):
    """time_it for several calls at once: cases is a list of (fn, before);
    each round times every case once, in an order rotated by one each
    round, so that clock and temperature drift over the run reach every
    case alike. Returns the medians (ms), in the order of cases."""
    for _ in range(warmup):
        for fn, before in cases:
            if before: before()
            fn()
    torch.cuda.synchronize()
    times = [[] for _ in cases]
    for r in range(reps):
        for i in range(len(cases)):
            k = (i + r) % len(cases)
            times[k].append(timed_call(*cases[k]))
    return [statistics.median(t) for t in times]


def extra_mem(fn, baseline_extra=0, before=None):
    """Peak bytes allocated by torch's allocator during fn() beyond what was
    allocated before it, minus baseline_extra (e.g. the gradient's size)."""
    if before: before()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return max(0, torch.cuda.max_memory_allocated() - base - baseline_extra)


def copy_bandwidth(nbytes=4 << 30):
    x = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    y = torch.empty_like(x)
    ms, _ = time_it(lambda: y.copy_(x), 10, 2)
    del x, y
    return 2 * nbytes / (ms * 1e-3)


def _triton_read_ms(x, reps=10, warmup=2):
    """Median ms of a plain Triton read of x (int32 view: every byte read
    once, one max a block written), or None without Triton."""
    try:
        import triton
        import triton.language as tl
    except Exception:  # noqa: BLE001
        return None

    @triton.jit
    def _read(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n, other=0)
        tl.store(out_ptr + pid, tl.max(v, axis=0))

    xi = x.view(torch.int32)
    n, best = xi.numel(), None
    for block in (4096, 16384):
        out = torch.empty(triton.cdiv(n, block), dtype=torch.int32, device=x.device)
        ms, _ = time_it(lambda: _read[(out.numel(),)](xi, out, n, BLOCK=block, num_warps=8),
                        reps, warmup)
        best = ms if best is None else min(best, ms)
    return best


def read_bandwidth(nbytes=4 << 30):
    """The read floor's bandwidth: the faster of torch's sum and a plain
    Triton read kernel over the same 4 GiB (torch's reduction alone reads
    a few percent slower than the memory allows). Returns (bandwidth, the
    rates of each reader)."""
    x = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    ms, _ = time_it(lambda: x.sum(), 10, 2)
    rates = {"torch sum": nbytes / (ms * 1e-3)}
    tms = _triton_read_ms(x)
    if tms is not None:
        rates["triton read"] = nbytes / (tms * 1e-3)
    del x
    return max(rates.values()), rates


# ------------------------------------------------------------------ main --
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="16384x128256,8192x151936,32768x32000",
                    help="comma-separated TxV list (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=20, help="timed runs (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    ap.add_argument("--lib", default="build/libxent.so", help="library (default build/libxent.so)")
    ap.add_argument("--json", default=None, help="also write the results here (default: none)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (default: run it)")
    ap.add_argument("--no-peers", action="store_true", help="xent only (default: all peers)")
    ap.add_argument("--exact", action="store_true",
                    help="also time xent in exact mode (xent_cuda_set_exact(1): bf16 on the "
                         "precise path), in place and forward-only (default: off)")
    ap.add_argument("--variants", default="",
                    help="also time xent under launch settings, comma-separated, each "
                         "kernel plans, FIELD=VALUE[+FIELD=VALUE] of xent_cuda_plan "
                         "(kernel, block, stage_bytes, onchip_blocks, onchip_threads, "
                         "onchip_groups), on each shape (default: none)")
    args = ap.parse_args()

    lib = load_lib(args.lib)
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    stream = lambda: C.c_void_p(torch.cuda.current_stream().cuda_stream)
    copy_bw = copy_bandwidth()
    read_bw, read_rates = read_bandwidth()
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy
    except Exception as e:  # noqa: BLE001
        liger_cross_entropy = None
        print(f"Liger-Kernel not importable ({e}): its rows are skipped")
    print(f"device {dev}; copy bandwidth {copy_bw / 1e12:.3f} TB/s (read+write), "
          f"read bandwidth {read_bw / 1e12:.3f} TB/s ("
          + ", ".join(f"{k} {v / 1e12:.3f}" for k, v in read_rates.items())
          + f"); torch {torch.__version__}")

    rows = []
    for shape in args.shapes.split(","):
        T, V = (int(s) for s in shape.split("x"))
        master = (torch.randn(T, V, device="cuda", dtype=torch.float32) * 2.0).to(torch.bfloat16)
        labels = torch.randint(0, V, (T,), device="cuda", dtype=torch.int64)
        labels[torch.rand(T, device="cuda") < 0.05] = -100
        floor_ms = 4 * T * V / copy_bw * 1e3
        rfloor_ms = 2 * T * V / read_bw * 1e3
        grad_bytes = T * V * 2

        def add(kind, name, ms, extra, floor, ref=None, loss=None):
            rows.append(dict(shape=f"{T}x{V}", kind=kind, impl=name, ms=ms,
                             extra_gib=None if extra is None else extra / 2**30,
                             floor_ms=floor, frac=floor / ms, loss=loss))
            print(f"  {T}x{V} {kind:8s} {name:34s} {ms:8.3f} ms  "
                  f"{'' if extra is None else f'+{extra / 2**30:.2f} GiB'}  "
                  f"{100 * floor / ms:5.1f}% of floor {floor:.3f} ms"
                  + ("" if loss is None else f"  loss {loss:.6f}"), flush=True)

        # ---- xent, forward + backward
        logits = master.clone()
        grad = torch.empty_like(master)
        loss = torch.empty(1, device="cuda", dtype=torch.float32)
        opts = default_opts()

        def xent_call(g_ptr, lg):
            inp = Input(lg.data_ptr(), XENT_BF16, T, V, 0, labels.data_ptr(), XENT_I64, None)
            out = Output(loss.data_ptr(), None, None, None, None, None, g_ptr, XENT_BF16, 0,
                         None, None)
            st = lib.xent_cuda_ce(C.byref(inp), C.byref(opts), C.byref(out), stream())
            if st != 0:
                sys.exit(f"xent_cuda_ce failed: {lib.xent_last_error().decode()}")

        XENT_SCRATCH_GRAD = 16 + 576  # the label record and the reductions' accumulator
        def with_setting(setter, value, fn):
            """fn with a per-thread library setting (the label check, exact
            mode) held at value, restored after"""
            def call():
                old = setter(value)
                try:
                    fn()
                finally:
                    setter(old)
            return call
        unchecked = lambda fn: with_setting(lib.xent_cuda_set_label_check, 0, fn)

        # the xent calls of this shape timed together (time_interleaved)
        restore = lambda: logits.copy_(master)
        lp = torch.empty(T, device="cuda", dtype=torch.float32)
        ent = torch.empty(T, device="cuda", dtype=torch.float32)

        def xent_lp(with_entropy=False):
            inp = Input(master.data_ptr(), XENT_BF16, T, V, 0, labels.data_ptr(), XENT_I64, None)
            st = lib.xent_cuda_logprobs(C.byref(inp), C.byref(opts), C.c_void_p(lp.data_ptr()),
                                        C.c_void_p(ent.data_ptr()) if with_entropy else None,
                                        stream())
            if st != 0:
                sys.exit(f"xent_cuda_logprobs failed: {lib.xent_last_error().decode()}")
        gcall = lambda: xent_call(grad.data_ptr(), logits)
        # (one group a kind: a forward-only call after a gradient call would
        # also pay for the L2's dirty lines the latter left, which the peers,
        # each timed after itself, do not)
        xms = time_interleaved([(gcall, None), (unchecked(gcall), None),
                                (lambda: xent_call(logits.data_ptr(), logits), restore)],
                               args.reps, args.warmup)
        xms += time_interleaved([(xent_lp, None), (unchecked(xent_lp), None),
                                 (lambda: xent_lp(True), None)], args.reps, args.warmup)
        restore()
        gcall()
        add("fwd+bwd", "xent (grad buffer)", xms[0], XENT_SCRATCH_GRAD, floor_ms, loss=loss.item())
        add("fwd+bwd", "xent (grad buffer, unchecked)", xms[1], XENT_SCRATCH_GRAD, floor_ms)
        add("fwd+bwd", "xent (in place)", xms[2], XENT_SCRATCH_GRAD, floor_ms)
        if args.exact:
            exact = lambda fn: with_setting(lib.xent_cuda_set_exact, 1, fn)
            ms, _ = time_it(exact(lambda: xent_call(logits.data_ptr(), logits)), args.reps,
                            args.warmup, before=restore)
            add("fwd+bwd", "xent exact mode (in place)", ms, XENT_SCRATCH_GRAD, floor_ms)
            ms, _ = time_it(exact(xent_lp), args.reps, args.warmup)
            add("logprobs", "xent exact mode", ms, None, rfloor_ms)
            restore()
        for var in filter(None, args.variants.split(",")):
            set_plan(lib, var)
            ms, _ = time_it(lambda: xent_call(grad.data_ptr(), logits), args.reps, args.warmup)
            add("fwd+bwd", f"xent variant {var}", ms, None, floor_ms)
            ms, _ = time_it(lambda: xent_call(logits.data_ptr(), logits), args.reps, args.warmup,
                            before=restore)
            add("fwd+bwd", f"xent variant {var} (in place)", ms, None, floor_ms)
            restore()
            lp_v = torch.empty(T, device="cuda", dtype=torch.float32)

            def lp_call():
                inp = Input(master.data_ptr(), XENT_BF16, T, V, 0, labels.data_ptr(), XENT_I64,
                            None)
                lib.xent_cuda_logprobs(C.byref(inp), C.byref(opts), C.c_void_p(lp_v.data_ptr()),
                                       None, stream())
            ms, _ = time_it(lp_call, args.reps, args.warmup)
            add("logprobs", f"xent variant {var}", ms, None, rfloor_ms)
            set_plan(lib, None)
        xent_loss = None
        xent_call(grad.data_ptr(), logits)
        xent_loss = loss.item()
        xent_grad = grad.clone()
        del grad

        if not args.no_peers:
            def torch_bf16():
                x = master.detach().requires_grad_(True)
                F.cross_entropy(x, labels).backward()
                return x.grad

            def torch_f32(x=None):
                x = master.detach().requires_grad_(True)
                F.cross_entropy(x.float(), labels).backward()
                return x.grad

            ref_loss = F.cross_entropy(master.double(), labels).item()
            print(f"  {T}x{V} loss: xent {xent_loss:.9f}, float64 reference {ref_loss:.9f}, "
                  f"rel diff {abs(xent_loss - ref_loss) / abs(ref_loss):.2e}")
            g = torch_f32()
            rel = ((xent_grad.float() - g.float()).norm() / g.float().norm()).item()
            print(f"  {T}x{V} gradient vs torch fp32-upcast: rel L2 diff {rel:.2e}")
            del g
            for name, fn in (("torch eager bf16", torch_bf16), ("torch eager .float()", torch_f32)):
                ms, _ = time_it(fn, args.reps, args.warmup)
                add("fwd+bwd", name, ms, extra_mem(fn, grad_bytes), floor_ms)
            if not args.no_compile:
                def ce32(x, y):
                    return F.cross_entropy(x.float(), y)
                cce = torch.compile(ce32)

                def torch_comp():
                    x = master.detach().requires_grad_(True)
                    cce(x, labels).backward()
                    return x.grad
                ms, _ = time_it(torch_comp, args.reps, args.warmup)
                add("fwd+bwd", "torch.compile(.float() CE)", ms,
                    extra_mem(torch_comp, grad_bytes), floor_ms)
            if liger_cross_entropy is not None:
                def liger():
                    x = logits.detach().requires_grad_(True)
                    liger_cross_entropy(x, labels).backward()
                ms, _ = time_it(liger, args.reps, args.warmup, before=restore)
                add("fwd+bwd", "Liger-Kernel CE (in place)", ms,
                    extra_mem(liger, 0, before=restore), floor_ms)
                restore()

        # ---- forward only: per-token log-probabilities (xent timed above)
        add("logprobs", "xent_cuda_logprobs", xms[3], 16 * T + 16, rfloor_ms)
        add("logprobs", "xent_cuda_logprobs (unchecked)", xms[4], 16 * T + 16, rfloor_ms)
        add("logprobs", "xent_cuda_logprobs + entropy", xms[5], 16, rfloor_ms)
        if not args.no_peers:
            with torch.no_grad():
                f1 = lambda: -F.cross_entropy(master, labels, reduction="none")
                f2 = lambda: torch.log_softmax(master.float(), -1).gather(
                    1, labels.clamp(min=0)[:, None])[:, 0]
                for name, fn in (("torch CE none bf16", f1), ("torch fp32 log_softmax+gather", f2)):
                    ms, _ = time_it(fn, args.reps, args.warmup)
                    add("logprobs", name, ms, extra_mem(fn, 0), rfloor_ms)
                if not args.no_compile:
                    f3 = torch.compile(lambda x, y: torch.log_softmax(x.float(), -1).gather(
                        1, y.clamp(min=0)[:, None])[:, 0])
                    fn = lambda: f3(master, labels)
                    ms, _ = time_it(fn, args.reps, args.warmup)
                    add("logprobs", "torch.compile(log_softmax+gather)", ms, extra_mem(fn, 0),
                        rfloor_ms)
                if liger_cross_entropy is not None:
                    fn = lambda: liger_cross_entropy(master, labels, reduction="none")
                    ms, _ = time_it(fn, args.reps, args.warmup)
                    add("logprobs", "Liger-Kernel CE none (no grad)", ms, extra_mem(fn, 0),
                        rfloor_ms)
        del master, logits, labels, xent_grad
        torch.cuda.empty_cache()

    print()
    print(f"| T x V | kind | implementation | time (ms) | extra memory | % of floor |")
    print(f"|---|---|---|---|---|---|")
    for r in rows:
        ex = "" if r["extra_gib"] is None else (
            f"{r['extra_gib'] * 2**30 / 2**20:.2f} MiB" if r["extra_gib"] < 0.01
            else f"{r['extra_gib']:.2f} GiB")
        print(f"| {r['shape']} | {r['kind']} | {r['impl']} | {r['ms']:.3f} | {ex} | "
              f"{100 * r['frac']:.1f}% |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev, copy_bw=copy_bw, read_bw=read_bw, read_rates=read_rates,
                           torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC",
                                                                       time.gmtime()),
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
