#!/usr/bin/env python3
"""dev/cuda_ce_libs.py: builds of xent's CUDA cross-entropy against each other, in one run.

Loads each library of --libs (builds of different trees, e.g. a change and
the commit before it) through ctypes and times them on the inputs of
bench/cuda_ce_bench.py (bf16 logits, int64 labels with 5% ignored, loss
mean): forward + backward into a gradient buffer, in place, and
forward-only log-probabilities. Every call of a shape, all libraries and
kinds, is timed interleaved (one of each a round, in a rotating order), so
that drift over the run reaches them alike. Then checks that every library
gives the first one's bits: loss, gradient, log-probabilities. No peers:
bench/cuda_ce_bench.py times those.

Usage: python3 dev/cuda_ce_libs.py --libs A.so,B.so[,...]
       [--names a,b,...] [--shapes 16384x128256,8192x151936,32768x32000]
       [--reps 20] [--warmup 3] [--env XENT_CUDA_GROUP=auto[+NAME=VALUE]]
  --names  labels of the libraries in the table (default: their paths)
  --env    environment settings held for every call (default: none)
"""
import argparse
import ctypes as C
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from cuda_ce_bench import (Input, Output, XENT_BF16, XENT_I64,  # noqa: E402
                           copy_bandwidth, default_opts, load_lib, read_bandwidth,
                           time_interleaved)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--libs", required=True, help="comma-separated library paths")
    ap.add_argument("--names", default="", help="their labels (default: the paths)")
    ap.add_argument("--shapes", default="16384x128256,8192x151936,32768x32000",
                    help="comma-separated TxV list (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=20, help="timed rounds (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    ap.add_argument("--env", default="", help="NAME=VALUE[+NAME=VALUE] for every call")
    args = ap.parse_args()
    paths = args.libs.split(",")
    names = args.names.split(",") if args.names else paths
    if len(names) != len(paths):
        sys.exit("--names: one label a library")
    if args.env:
        os.environ.update(dict(kv.split("=", 1) for kv in args.env.split("+")))
    libs = [load_lib(p) for p in paths]
    torch.manual_seed(0)
    stream = lambda: C.c_void_p(torch.cuda.current_stream().cuda_stream)
    copy_bw = copy_bandwidth()
    read_bw, _ = read_bandwidth()
    print(f"device {torch.cuda.get_device_name()}; copy bandwidth {copy_bw / 1e12:.3f} TB/s, "
          f"read bandwidth {read_bw / 1e12:.3f} TB/s; env {args.env or '(none)'}")
    table = []
    bad = 0
    for shape in args.shapes.split(","):
        T, V = (int(s) for s in shape.split("x"))
        master = (torch.randn(T, V, device="cuda", dtype=torch.float32) * 2.0).to(torch.bfloat16)
        labels = torch.randint(0, V, (T,), device="cuda", dtype=torch.int64)
        labels[torch.rand(T, device="cuda") < 0.05] = -100
        logits = master.clone()
        grad = torch.empty_like(master)
        loss = torch.empty(1, device="cuda", dtype=torch.float32)
        lp = torch.empty(T, device="cuda", dtype=torch.float32)
        opts = default_opts()
        restore = lambda: logits.copy_(master)

        def ce(lib, g_ptr, lg):
            inp = Input(lg.data_ptr(), XENT_BF16, T, V, 0, labels.data_ptr(), XENT_I64, None)
            out = Output(loss.data_ptr(), None, None, None, None, None, g_ptr, XENT_BF16, 0,
                         None, None)
            if lib.xent_cuda_ce(C.byref(inp), C.byref(opts), C.byref(out), stream()) != 0:
                sys.exit(f"xent_cuda_ce failed: {lib.xent_last_error().decode()}")

        def logprobs(lib):
            inp = Input(master.data_ptr(), XENT_BF16, T, V, 0, labels.data_ptr(), XENT_I64, None)
            if lib.xent_cuda_logprobs(C.byref(inp), C.byref(opts), C.c_void_p(lp.data_ptr()),
                                      None, stream()) != 0:
                sys.exit(f"xent_cuda_logprobs failed: {lib.xent_last_error().decode()}")

        kinds = ("grad buffer", "in place", "logprobs")
        cases = []
        for lib in libs:
            cases += [(lambda lib=lib: ce(lib, grad.data_ptr(), logits), None),
                      (lambda lib=lib: ce(lib, logits.data_ptr(), logits), restore),
                      (lambda lib=lib: logprobs(lib), None)]
        ms = time_interleaved(cases, args.reps, args.warmup)
        floors = (4 * T * V / copy_bw * 1e3, 4 * T * V / copy_bw * 1e3, 2 * T * V / read_bw * 1e3)
        ref = None
        for li, (lib, name) in enumerate(zip(libs, names)):
            restore()
            ce(lib, grad.data_ptr(), logits)
            logprobs(lib)
            torch.cuda.synchronize()
            got = (loss.clone(), grad.clone(), lp.clone())
            if ref is None:
                ref, same = got, "reference"
            else:
                diff = [int((a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32)
                             != b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32))
                            .sum()) for a, b in zip(ref, got)]
                same = "same bits" if not any(diff) else (
                    f"DIFFERENT: loss {diff[0]}, gradient {diff[1]}, logprobs {diff[2]} elements")
                bad += any(diff)
            for ki, kind in enumerate(kinds):
                t = ms[3 * li + ki]
                table.append((shape, kind, name, t, 100 * floors[ki] / t))
            print(f"  {shape} {name}: {same}", flush=True)
        del master, logits, grad, labels
        torch.cuda.empty_cache()
    print("\n| T x V | kind | library | time (ms) | % of floor |\n|---|---|---|---|---|")
    for shape, kind, name, t, frac in table:
        print(f"| {shape} | {kind} | {name} | {t:.3f} | {frac:.1f}% |")
    print(f"\nbits: {'every library gives the first one' if not bad else f'{bad} shapes differ'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
