#!/bin/sh
# tests/stages/cli_ce.sh: `xent ce` on files written by numpy (.npy versions
# 1.0, 2.0 and 3.0; f4/f2 logits; i8/i4 labels; [T, V] and [B, S, V]), with
# the outputs read back by numpy and checked against a float64 reference:
#   nll      |err| <= 1 ulp(nll)   (faithful, docs/numerics.md; the float64
#   lse      |err| <= 1 ulp(lse)    reference adds at most 1e-13 relative)
#   logprob  == -nll exactly; loss (reduction none) == nll exactly
#   grad f32 |err| <= 1 ulp(ref) + 1e-12 |ref|: the kernel rounds once from a
#            double value (faithful rounding), the float64 reference carries a
#            relative error below 1e-13 for these |z| <= 40 rows.
# bf16 logits as the '<V2' .npy numpy writes for ml_dtypes.bfloat16 are read;
# a raw '|V2' array is refused with a hint.
# Prints "N passed, N failed[, N skipped]" last. Needs numpy (else skipped).
BUILD=${BUILD:-build}
XENT="$BUILD/xent"
if [ ! -x "$XENT" ]; then echo "$XENT not built"; echo "0 passed, 0 failed, 1 skipped"; exit 0; fi
if ! python3 -c "import numpy" 2>/dev/null; then
    echo "numpy not installed: skipped"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
exec python3 - "$XENT" <<'EOF'
import os, subprocess, sys, tempfile
import numpy as np
from numpy.lib import format as npf

xent = sys.argv[1]
passed = failed = 0

def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
        print("ok  ", what)
    else:
        failed += 1
        print("FAIL", what)

def ulp32(x):
    return np.spacing(np.abs(x).astype(np.float32)).astype(np.float64)

def reference(z, t):
    """float64 nll (as softplus of the non-target logsumexp minus z_t), lse, grad."""
    T, V = z.shape
    nll = np.zeros(T); lse = np.zeros(T); grad = np.zeros((T, V))
    for i in range(T):
        m = z[i].max()
        lse[i] = m + np.log(np.exp(z[i] - m).sum())
        if t[i] == -100:
            continue
        others = np.delete(z[i], t[i])
        if others.size:  # V = 1: p_t = 1, nll = 0
            mo = others.max()
            d = mo + np.log(np.exp(others - mo).sum()) - z[i, t[i]]
            nll[i] = np.logaddexp(0.0, d)
        grad[i] = np.exp(z[i] - lse[i])
        grad[i, t[i]] = np.expm1(-nll[i])
    return nll, lse, grad

def save(path, arr, version):
    with open(path, "wb") as f:
        npf.write_array(f, arr, version=version)

seed = int(os.environ.get("XENT_TEST_SEED") or np.random.SeedSequence().entropy % 2**32)
print(f"cli_ce: seed {seed} (re-run with XENT_TEST_SEED={seed})")
rng = np.random.default_rng(seed)
cases = [("<f4", "<i8", (1, 0), (7, 50)), ("<f2", "<i4", (2, 0), (2, 3, 33)),
         ("<f4", "<i4", (3, 0), (2, 4, 129)), ("<f2", "<i8", (1, 0), (5, 1))]
with tempfile.TemporaryDirectory() as d:
    for k, (ld, bd, ver, shape) in enumerate(cases):
        name = f"case{k} logits {ld} labels {bd} npy {ver[0]}.0 shape {shape}"
        z = (rng.standard_normal(shape) * 8).clip(-40, 40).astype(ld)
        t = rng.integers(0, shape[-1], size=shape[:-1]).astype(bd)
        t.reshape(-1)[::4] = -100
        lp, bp, out = f"{d}/z{k}.npy", f"{d}/t{k}.npy", f"{d}/o{k}.npy"
        save(lp, z, ver); save(bp, t, ver)
        r = subprocess.run([xent, "ce", "--logits", lp, "--labels", bp, "--out", out, "--grad",
                            "--grad-dtype", "f32", "--entropy", "--reduction", "none"],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"{name}: exit {r.returncode} {r.stderr.strip()}")
        if r.returncode:
            continue
        stem = out[:-4]
        o = {n: np.load(f"{stem}.{n}.npy") for n in ("loss", "nll", "logprob", "lse", "entropy", "grad")}
        z2 = z.reshape(-1, shape[-1]).astype(np.float64)
        t2 = t.reshape(-1).astype(np.int64)
        nll, lse, grad = reference(z2, t2)
        check(o["nll"].shape == shape[:-1] and o["grad"].shape == shape, f"{name}: shapes")
        got = o["nll"].reshape(-1).astype(np.float64)
        check(np.all(np.abs(got - nll) <= ulp32(nll) + 1e-13 * np.abs(nll)), f"{name}: nll within 1 ulp")
        scale = np.maximum(np.abs(lse), np.abs(z2).max(axis=1))
        check(np.all(np.abs(o["lse"].reshape(-1) - lse) <= ulp32(lse) + 1e-13 * scale), f"{name}: lse within 1 ulp")
        check(np.array_equal(o["logprob"], -o["nll"]) and np.array_equal(o["loss"], o["nll"]),
              f"{name}: logprob == -nll, loss == nll")
        g = o["grad"].reshape(z2.shape).astype(np.float64)
        check(np.all(np.abs(g - grad) <= ulp32(grad) + 1e-12 * np.abs(grad)), f"{name}: grad faithful")
        check(np.all(np.isfinite(o["entropy"])), f"{name}: entropy finite")
    # bfloat16 as numpy writes ml_dtypes.bfloat16: descr '<V2' (made here from
    # the bits, so that the case runs without ml_dtypes; tests/stages/
    # cli_cases.sh writes it with ml_dtypes): read as bf16
    z = (rng.standard_normal((7, 50)) * 8).clip(-40, 40).astype(np.float32)
    u = z.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    p = f"{d}/bf.npy"
    np.save(p, bits)
    raw = open(p, "rb").read()
    open(p, "wb").write(raw.replace(b"'descr': '<u2'", b"'descr': '<V2'", 1))
    t = rng.integers(0, 50, size=7).astype(np.int64)
    np.save(f"{d}/tb.npy", t)
    r = subprocess.run([xent, "ce", "--logits", p, "--labels", f"{d}/tb.npy", "--out", f"{d}/bf_o.npy",
                        "--reduction", "none"], capture_output=True, text=True)
    check(r.returncode == 0, f"'<V2' (ml_dtypes bfloat16) logits read as bf16: {r.stderr.strip()}")
    if r.returncode == 0:
        zb = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        nll, lse, _ = reference(zb, t)
        got = np.load(f"{d}/bf_o.nll.npy").astype(np.float64)
        check(np.all(np.abs(got - nll) <= ulp32(nll) + 1e-13 * np.abs(nll)), "'<V2' logits: nll within 1 ulp")
    # a raw 2-byte void ('|V2') is not bfloat16: refused with a hint
    p = f"{d}/v2.npy"
    np.save(p, np.zeros((2, 3), dtype="V2"))
    r = subprocess.run([xent, "ce", "--logits", p, "--labels", f"{d}/t0.npy", "--out", f"{d}/x.npy"],
                       capture_output=True, text=True)
    check(r.returncode == 1 and "V2" in r.stderr and "ml_dtypes" in r.stderr,
          f"'|V2' logits refused with a hint: {r.stderr.strip()}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
EOF
