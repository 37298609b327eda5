#!/usr/bin/env python3
"""bench/torch_anchor.py: PyTorch's CPU cross-entropy and the Python xent
call next to xent's floor, and the one table of `make bench`.

Reads what `xent bench` printed (file given as argv[1]): the bandwidth lines
("# bw threads=N copy=... read=...") and its rows (xent_ce, logprobs, the
plain fp32 anchor). Times, on the same T x V inputs (5% labels ignored), per
thread count:
  torch F.cross_entropy forward+backward (fp32 and bf16 logits, grad in the
  same dtype) and log_softmax + gather forward (fp32 and bf16);
  the Python xent call (xent.nn.functional.cross_entropy(x, y).backward()
  and xent.logprobs, bf16 and fp32) and, on the same tensors, the C calls
  it wraps (xent_ce with the gradient into a buffer reused across runs, as
  `xent bench`; xent_logprobs) through ctypes; bench/python_vs_c.py has
  the detailed comparison,
the cases of one dtype and thread count interleaved (one run of each in
turn),
each as a fraction of the same floor as xent's rows, then prints every row
as one Markdown table (date, commit, CPU, threads) for bench/RESULTS.md.
Without torch it says so and exits 0 (`pip install torch` adds it)."""
import datetime
import os
import pathlib
import re
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def commit():
    """The checked-out commit, read from .git (no git process)."""
    try:
        g = ROOT / ".git"
        head = (g / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            ref = head[5:]
            p = g / ref
            if p.is_file():
                return p.read_text().strip()[:12]
            for line in (g / "packed-refs").read_text().splitlines():
                if line.endswith(" " + ref):
                    return line.split()[0][:12]
            return "?"
        return head[:12]
    except OSError:
        return "?"


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def interleaved(fns, reps):
    """(median, min, max) of each function's time, one run of each in turn
    per repetition (after one warm-up round), so that a load change on a
    shared machine hits them alike."""
    ts = [[] for _ in fns]
    for r in range(-1, reps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            if r >= 0:
                ts[i].append(time.perf_counter() - t0)
    out = []
    for v in ts:
        v.sort()
        out.append((v[len(v) // 2], v[0], v[-1]))
    return out


def main():
    if len(sys.argv) < 2:
        print("usage: torch_anchor.py XENT_BENCH_OUTPUT [T V reps]",
              file=sys.stderr)
        return 2
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("torch anchor: skipped (PyTorch is not installed; "
              "`pip install torch` adds it)")
        return 0
    T, V, reps = 2048, 128256, 5
    if len(sys.argv) >= 5:
        T, V, reps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    bws, rows, isa = {}, [], "?"
    for line in open(sys.argv[1]):
        m = re.match(r"# bw threads=(\d+) copy=(\S+) read=(\S+) "
                     r"copy_cpu=(\S+) read_cpu=(\S+)", line)
        if m:
            bws[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
        m = re.match(r"(fwd\+bwd \(xent_ce\)|fwd only \(logprobs\)|"
                     r"plain fp32 fwd\+bwd|plain fp32 fwd only)\s+(\d+)\s+"
                     r"(\S+)\s+\S+\s+(\S+)\s+(\d+)%", line)
        if m:
            rows.append((m.group(1), int(m.group(2)), float(m.group(3)),
                         float(m.group(4)), int(m.group(5))))
        m = re.match(r"xent CPU path: (\S+)", line)
        if m:
            isa = m.group(1)
    xent = None
    try:
        sys.path.insert(0, str(ROOT / "python"))
        sys.path.insert(0, str(ROOT / "bench"))
        if "XENT_LIBRARY" not in os.environ:
            build = os.environ.get("BUILD", "build")
            os.environ["XENT_LIBRARY"] = str(ROOT / build / "libxent.so")
        import xent
        import xent.nn.functional as XF
    except Exception as e:                          # noqa: BLE001
        print("python xent: skipped (%s)" % e)
        xent = None
    g = torch.Generator().manual_seed(1)
    z32 = (torch.rand(T, V, generator=g) * 4 - 2) * 3.5
    labels = torch.randint(0, V, (T,), generator=g)
    labels[torch.rand(T, generator=g) < 0.05] = -100
    print("torch %s anchor and the Python xent call (median of %d runs):"
          % (torch.__version__, reps))
    for th in sorted(bws):
        torch.set_num_threads(th)
        if xent is not None:
            xent.set_num_threads(th)
        copy_bw, read_bw = bws[th]
        for dt in (torch.float32, torch.bfloat16):
            z = z32.to(dt)
            esz = z.element_size()
            dname = str(dt).replace("torch.", "")

            def fb():
                x = z.detach().requires_grad_(True)
                F.cross_entropy(x, labels, ignore_index=-100).backward()

            def fw():
                with torch.no_grad():
                    torch.log_softmax(z, dim=-1).gather(
                        1, labels.clamp(min=0)[:, None])

            def xfb():
                x = z.detach().requires_grad_(True)
                XF.cross_entropy(x, labels).backward()

            def xfw():
                xent.logprobs(z, labels)

            cases = [("torch %s F.cross_entropy fwd+bwd" % dname, fb,
                      2 * esz * T * V, copy_bw),
                     ("torch %s log_softmax+gather" % dname, fw,
                      esz * T * V, read_bw)]
            if xent is not None:
                from python_vs_c import CCall
                cc = CCall(z, labels, th)
                cases += [("C xent_ce %s fwd+bwd (ctypes)" % dname, cc.ce,
                           2 * esz * T * V, copy_bw),
                          ("python xent %s fwd+bwd" % dname, xfb,
                           2 * esz * T * V, copy_bw),
                          ("C xent_logprobs %s (ctypes)" % dname,
                           cc.logprobs, esz * T * V, read_bw),
                          ("python xent %s logprobs" % dname, xfw,
                           esz * T * V, read_bw)]
            res = interleaved([c[1] for c in cases], reps)
            cc = None
            for (name, fn, nbytes, bw), (t, lo, hi) in zip(cases, res):
                floor = nbytes / bw
                pct = 100 * floor / t
                print("%-40s %3d %9.1f ms  floor %6.1f ms  %4.0f%%  "
                      "(spread %.1f-%.1f ms)" % (name, th, 1e3 * t,
                                                 1e3 * floor, pct, 1e3 * lo,
                                                 1e3 * hi))
                rows.append((name, th, 1e3 * t, 1e3 * floor, round(pct)))
    # the one table of the run
    ths = sorted(bws)
    load = " ".join("%.2f" % v for v in os.getloadavg())
    print()
    print("%s, commit %s, %s (%d cores, xent CPU path %s), threads %s, "
          "load %s; T = %d, V = %d, 5%% ignored, mean; xent_ce rows are "
          "bf16 in and out; median of %d; floor = one read of the logits "
          "(+ one write of the gradient) at this run's copy / read "
          "bandwidth" % (datetime.date.today().isoformat(), commit(),
                         cpu_model(), os.cpu_count() or 0, isa,
                         ",".join(map(str, ths)), load, T, V, reps))
    print()
    print("| path | " + " | ".join("%d thr: ms (floor %%)" % th
                                   for th in ths) + " |")
    print("|---|" + "---|" * len(ths))
    names = []
    for r in rows:
        if r[0] not in names:
            names.append(r[0])
    for n in names:
        cells = []
        for th in ths:
            r = [x for x in rows if x[0] == n and x[1] == th]
            cells.append("%.1f (%d%%)" % (r[0][2], r[0][4]) if r else "-")
        print("| %s | %s |" % (n, " | ".join(cells)))
    print("| floor, bf16 fwd+bwd / fwd (ms) | %s |" % " | ".join(
        "%.1f / %.1f" % (1e3 * 4 * T * V / bws[th][0],
                         1e3 * 2 * T * V / bws[th][1]) for th in ths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
