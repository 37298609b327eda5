"""Forward + backward time and peak extra memory of xent.cross_entropy
against torch's F.cross_entropy on CUDA (bf16 logits, 5% ignored rows,
mean loss), plus forward-only xent.logprobs.

    python3 python/bench_torch.py [--shapes 16384x128256,8192x151936]

Times: median of --reps CUDA-event timings after one warm-up. Peak extra:
torch.cuda.max_memory_allocated() above what was allocated before the call
(the input logits and labels excluded)."""
import argparse
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import xent  # noqa: E402


def measure(make_input, fn, reps):
    """(median ms, peak extra GiB) of fn(make_input()) + its backward."""
    times, peak = [], 0
    for i in range(reps + 1):
        h = make_input()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        loss = fn(h)
        g, = torch.autograd.grad(loss, h)
        b.record()
        torch.cuda.synchronize()
        peak = max(peak, torch.cuda.max_memory_allocated() - base)
        if i:
            times.append(a.elapsed_time(b))
        del g, loss, h
    return sorted(times)[len(times) // 2], peak / 2 ** 30


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="16384x128256,8192x151936",
                    help="TxV list (default 16384x128256,8192x151936)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs (5)")
    a = ap.parse_args()
    torch.manual_seed(0)
    print("libxent %s, torch %s, %s" % (xent.version(), torch.__version__,
                                        torch.cuda.get_device_name()))
    for shape in a.shapes.split(","):
        T, V = (int(s) for s in shape.split("x"))
        z = torch.randn(T, V, device="cuda", dtype=torch.bfloat16)
        y = torch.randint(0, V, (T,), device="cuda")
        y[::20] = -100
        leaf = z.clone().requires_grad_(True)
        cases = [
            ("xent", lambda: leaf, lambda h: xent.cross_entropy(h, y)),
            ("xent inplace", lambda: z.clone().requires_grad_(True) * 1,
             lambda h: xent.cross_entropy(h, y, inplace_backward=True)),
            ("F.cross_entropy bf16", lambda: leaf,
             lambda h: F.cross_entropy(h, y)),
            ("F.cross_entropy fp32", lambda: leaf,
             lambda h: F.cross_entropy(h.float(), y)),
        ]
        for name, make_input, fn in cases:
            ms, gib = measure(make_input, fn, a.reps)
            print("%s %-22s fwd+bwd %7.2f ms  peak extra %6.2f GiB"
                  % (shape, name, ms, gib))
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        xent.logprobs(z, y)
        s.record()
        for _ in range(a.reps):
            xent.logprobs(z, y)
        e.record()
        torch.cuda.synchronize()
        print("%s %-22s forward %7.2f ms" % (shape, "xent.logprobs",
                                             s.elapsed_time(e) / a.reps))
        z = leaf = None     # free before the next shape


if __name__ == "__main__":
    main()
