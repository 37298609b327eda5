#!/usr/bin/env python3
"""bench/cuda_ce_profile.py: one xent CUDA cross-entropy call, repeated, for a profiler.

Runs --reps calls of one kind on one shape (bf16 logits, int64 labels with 5%
ignored, loss mean), the inputs of bench/cuda_ce_bench.py, and nothing else,
so that `ncu -k regex:row_kernel --launch-skip 1 --launch-count 1` sees
exactly the kernel wanted. Prints the median time of the calls.

Usage: python3 bench/cuda_ce_profile.py [--shape 16384x128256] [--kind inplace]
       [--reps 3] [--lib build/libxent.so]
  --kind inplace   forward + backward, gradient written over the logits (default)
         grad      forward + backward into a separate gradient buffer
         logprobs  forward-only per-token log-probabilities
         backward  the gradient in place from saved per-row statistics (pass 2
                   alone; one forward call first makes the statistics, so
                   skip 2 launches in ncu)
"""
import argparse
import ctypes as C
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_ce_bench import (Input, Output, XENT_BF16, XENT_I64,  # noqa: E402
                           default_opts, load_lib)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="16384x128256", help="TxV (default: %(default)s)")
    ap.add_argument("--kind", default="inplace",
                    choices=("inplace", "grad", "logprobs", "backward"),
                    help="call to repeat (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=3, help="calls (default 3)")
    ap.add_argument("--lib", default="build/libxent.so", help="library (default: %(default)s)")
    args = ap.parse_args()
    lib = load_lib(args.lib)
    T, V = (int(s) for s in args.shape.split("x"))
    torch.manual_seed(0)
    master = (torch.randn(T, V, device="cuda", dtype=torch.float32) * 2.0).to(torch.bfloat16)
    labels = torch.randint(0, V, (T,), device="cuda", dtype=torch.int64)
    labels[torch.rand(T, device="cuda") < 0.05] = -100
    logits = master.clone()
    grad = torch.empty_like(master) if args.kind == "grad" else logits
    loss = torch.empty(1, device="cuda", dtype=torch.float32)
    lp = torch.empty(T, device="cuda", dtype=torch.float32)
    opts = default_opts()
    stream = C.c_void_p(torch.cuda.current_stream().cuda_stream)
    inp = Input(logits.data_ptr(), XENT_BF16, T, V, 0, labels.data_ptr(), XENT_I64, None)
    out = Output(loss.data_ptr(), None, None, None, None, None, grad.data_ptr(), XENT_BF16, 0,
                 None, None)
    lib.xent_cuda_ce_backward.argtypes = [C.POINTER(type(inp)), C.POINTER(type(opts)),
                                          C.c_void_p, C.c_void_p, C.c_int, C.c_int64,
                                          C.c_void_p]
    stats = torch.empty(T, 2, device="cuda", dtype=torch.float64)  # xent_ce_stats [T]
    if args.kind == "backward":
        so = Output(None, None, None, None, None, stats.data_ptr(), None, XENT_BF16, 0, None,
                    None)
        if lib.xent_cuda_ce(C.byref(inp), C.byref(opts), C.byref(so), stream) != 0:
            sys.exit(f"xent call failed: {lib.xent_last_error().decode()}")
    times = []
    for _ in range(args.reps):
        logits.copy_(master)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        if args.kind == "backward":
            st = lib.xent_cuda_ce_backward(C.byref(inp), C.byref(opts),
                                           C.c_void_p(stats.data_ptr()),
                                           C.c_void_p(logits.data_ptr()), XENT_BF16, 0, stream)
        elif args.kind == "logprobs":
            st = lib.xent_cuda_logprobs(C.byref(inp), C.byref(opts), C.c_void_p(lp.data_ptr()),
                                        None, stream)
        else:
            st = lib.xent_cuda_ce(C.byref(inp), C.byref(opts), C.byref(out), stream)
        b.record()
        b.synchronize()
        if st != 0:
            sys.exit(f"xent call failed: {lib.xent_last_error().decode()}")
        times.append(a.elapsed_time(b))
    print(f"{args.shape} {args.kind}: median {statistics.median(times):.3f} ms of {args.reps}")


if __name__ == "__main__":
    main()
