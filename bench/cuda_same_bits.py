#!/usr/bin/env python3
"""Compares two builds of the library bit for bit on a GPU: every output of
xent_cuda_ce with and without a gradient (loss, nll, lse, log-probability,
entropy, counts, gradient, into a buffer, into a buffer whose rows are aligned unlike the
logits' and in place; without a gradient also without entropy) and of
xent_cuda_logprobs, for bf16, f16 and f32
logits, V from 1000 (on-chip kernel) to 151936, unaligned rows, logits
scaled by 0.05 to 30, rows with NaN, +inf, all -inf but one and all 0,
temperature with label smoothing and z-loss, and softcap. In the second
build it also checks that xent_cuda_ce's log-probabilities (with a
gradient) equal xent_cuda_logprobs'. For kernel changes meant to keep the
bits: build the old tree and the new one, then

    python3 bench/cuda_same_bits.py OLD/libxent.so NEW/libxent.so [PLAN_OLD [PLAN_NEW]]

PLAN_OLD and PLAN_NEW (kernel plans, FIELD=VALUE[+FIELD=VALUE] of
xent_cuda_plan, or - for the default) are set around each build's calls, so
that one build can be compared with itself under two plans.
It prints one line per difference and ends with "bitwise: N same, M
different"; it exits 1 when any differ."""
import ctypes as C, sys
import torch
sys.path.insert(0, "bench")
from cuda_ce_bench import (Input, Output, default_opts, load_lib, set_plan, XENT_BF16, XENT_F16,
                           XENT_F32, XENT_I64)
libs = [load_lib(sys.argv[1]), load_lib(sys.argv[2])]
plans = [a if a != "-" else None for a in (sys.argv[3:5] + ["-", "-"])[:2]]
stream = lambda: C.c_void_p(torch.cuda.current_stream().cuda_stream)
DT = {torch.bfloat16: XENT_BF16, torch.float16: XENT_F16, torch.float32: XENT_F32}
torch.manual_seed(2)  # fixed: both builds see the same inputs
cases = []
for V in (40000, 50021, 128256, 151936, 33000, 65537, 20000, 1000):
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        for scale in (0.05, 2.0, 30.0):
            cases.append((V, dt, scale, 0))
cases += [(128256, torch.bfloat16, 2.0, 3), (50021, torch.float16, 2.0, 8)]
opts_list = ((1.0, 0.0, 0.0, 0.0), (0.7, 0.1, 1e-4, 0.0), (1.0, 0.0, 0.0, 30.0))
n = bad = 0
def run(side, x, lab, T, V, ld, dt, o, grad, with_ent):
    set_plan(libs[side], plans[side])
    try:
        return run1(libs[side], x, lab, T, V, ld, dt, o, grad, with_ent)
    finally:
        set_plan(libs[side], None)
def run1(lib, x, lab, T, V, ld, dt, o, grad, with_ent):
    outs = {k: torch.full((T,), float("nan"), device="cuda") for k in ("nll", "lse", "logprob", "entropy")}
    loss = torch.full((1,), float("nan"), device="cuda")
    cnt = torch.full((2,), -7, device="cuda", dtype=torch.int64)
    # grad: False, "buf" (a separate buffer), "off" (a buffer starting 3
    # elements into its allocation: rows aligned unlike the logits' rows)
    # or "inplace" (written over a copy of the logits, which it reads)
    g = None
    if grad == "buf":
        g = torch.full((T, ld), float("nan"), device="cuda", dtype=dt)
    elif grad == "off":
        g = torch.full((T * ld + 3,), float("nan"), device="cuda", dtype=dt)[3:].view(T, ld)
    elif grad == "inplace":
        g = x.clone()
    inp = Input((g if grad == "inplace" else x).data_ptr(), DT[dt], T, V, ld, lab.data_ptr(),
                XENT_I64, None)
    inp0 = Input(x.data_ptr(), DT[dt], T, V, ld, lab.data_ptr(), XENT_I64, None)
    out = Output(loss.data_ptr(), outs["nll"].data_ptr(), outs["logprob"].data_ptr(), outs["lse"].data_ptr(),
                 outs["entropy"].data_ptr() if with_ent else None, None, g.data_ptr() if grad else None, DT[dt], ld,
                 cnt.data_ptr(), cnt[1:].data_ptr())
    st = lib.xent_cuda_ce(C.byref(inp), C.byref(o), C.byref(out), stream())
    lp = torch.full((T,), float("nan"), device="cuda")
    ent = torch.full((T,), float("nan"), device="cuda")
    st2 = lib.xent_cuda_logprobs(C.byref(inp0), C.byref(o), C.c_void_p(lp.data_ptr()), C.c_void_p(ent.data_ptr() if with_ent else None), stream())
    torch.cuda.synchronize()
    if st or st2:
        print("status", st, st2, lib.xent_last_error().decode())
    r = [outs[k].view(torch.int32).clone() for k in sorted(outs)] + [loss.view(torch.int32).clone(), cnt.clone(),
         lp.view(torch.int32).clone(), ent.view(torch.int32).clone()]
    if grad: r.append(g[:, :V].contiguous().view(torch.int16 if dt != torch.float32 else torch.int32).clone())
    return r
for V, dt, scale, pad in cases:
    T = 37
    ld = V + pad
    x = torch.randn(T, ld, device="cuda") * scale
    if dt == torch.float16: x = x.clamp(-60000, 60000)
    x = x.to(dt)
    x[3, 5] = float("nan"); x[4, 7] = float("inf"); x[5, :] = float("-inf"); x[5, 11] = 1.0
    x[6, :] = 0; x[7, min(100, V - 1)] = 1e4 if dt != torch.float16 else 6e4
    lab = torch.randint(0, V, (T,), device="cuda", dtype=torch.int64); lab[2] = -100
    for temp, ls, zl, cap in opts_list:
        o = default_opts(); o.temperature = temp; o.label_smoothing = ls; o.z_loss = zl; o.softcap = cap
        for grad, with_ent in ((False, True), (False, False), ("buf", True), ("off", False),
                               ("inplace", False)):
            a = run(0, x, lab, T, V, ld, dt, o, grad, with_ent)
            b = run(1, x, lab, T, V, ld, dt, o, grad, with_ent)
            n += 1
            diff = [i for i, (u, v) in enumerate(zip(a, b)) if not torch.equal(u, v)]
            if diff:
                bad += 1; print("DIFF old/new", V, dt, scale, pad, (temp, ls, zl, cap), grad, with_ent, diff)
            if grad:  # new build: logprob of ce-with-grad == xent_cuda_logprobs
                n += 1
                if not torch.equal(b[1], b[6]):
                    bad += 1; print("DIFF ce(grad) vs logprobs", V, dt, scale, (temp, ls, zl, cap))
print(f"bitwise: {n - bad} same, {bad} different")
sys.exit(1 if bad else 0)
