#!/usr/bin/env python3
"""bench/torch_anchor.py: PyTorch's CPU cross-entropy next to xent's floor.

Reads the bandwidth lines ("# bw threads=N copy=... read=...") that
`xent bench` printed (file given as argv[1]) and times, on the same
T x V inputs (roughly N(0, 4) logits, 5% labels ignored), per thread count:
  F.cross_entropy forward+backward (fp32 and bf16 logits, grad in the same dtype)
  log_softmax + gather forward (fp32 and bf16)
each as a fraction of the same floor as xent's rows. Without torch it says
so and exits 0 (PyPI's torch wheel is large; `pip install torch`)."""
import re
import sys
import time

def main():
    if len(sys.argv) < 2:
        print("usage: torch_anchor.py XENT_BENCH_OUTPUT [T V reps]", file=sys.stderr)
        return 2
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("torch anchor: skipped (PyTorch is not installed; `pip install torch` adds it)")
        return 0
    T, V, reps = 2048, 128256, 5
    if len(sys.argv) >= 5:
        T, V, reps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    bws = {}
    for line in open(sys.argv[1]):
        m = re.match(r"# bw threads=(\d+) copy=(\S+) read=(\S+) copy_cpu=(\S+) read_cpu=(\S+)", line)
        if m:
            bws[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    g = torch.Generator().manual_seed(1)
    z32 = (torch.rand(T, V, generator=g) * 4 - 2) * 3.5
    labels = torch.randint(0, V, (T,), generator=g)
    labels[torch.rand(T, generator=g) < 0.05] = -100
    print("torch %s anchor (median of %d runs):" % (torch.__version__, reps))
    for th in sorted(bws):
        torch.set_num_threads(th)
        copy_bw, read_bw = bws[th]
        for dt in (torch.float32, torch.bfloat16):
            z = z32.to(dt)
            esz = z.element_size()
            def fb():
                x = z.detach().requires_grad_(True)
                F.cross_entropy(x, labels, ignore_index=-100).backward()
            def fw():
                with torch.no_grad():
                    torch.log_softmax(z, dim=-1).gather(1, labels.clamp(min=0)[:, None])
            for name, fn, nbytes, bw in (("F.cross_entropy fwd+bwd", fb, 2 * esz * T * V, copy_bw),
                                         ("log_softmax+gather", fw, esz * T * V, read_bw)):
                fn()
                ts = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t0)
                ts.sort()
                t = ts[len(ts) // 2]
                floor = nbytes / bw
                print("%-34s %3d %9.1f ms  floor %6.1f ms  %4.0f%%  (spread %.1f-%.1f ms)" %
                      ("torch %s %s" % (str(dt).replace("torch.", ""), name), th, 1e3 * t,
                       1e3 * floor, 100 * floor / t, 1e3 * ts[0], 1e3 * ts[-1]))
    return 0

if __name__ == "__main__":
    sys.exit(main())
