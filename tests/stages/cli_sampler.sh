#!/bin/sh
# tests/stages/cli_sampler.sh: `xent logprobs` (processed log-probs:
# temperature, min-p, top-k, top-p; include/xent/sampler.h, docs/sampler.md)
# on files written by numpy, against a float64 NumPy reference of the rules
# written here from docs/sampler.md (sort, then cut):
#   - rows: random (coarse values, so ties), a top-p boundary row (the top-1
#     mass m1 of the row is the cut: p = m1 (1 - 1e-9) keeps 1, p = m1
#     (1 + 1e-9) keeps 2, both decided and unflagged; p = m1 itself is within
#     rounding: flag TOPP_NEAR), ties at the top-p cut (3 equal logits, p =
#     0.5: 2 kept, TOPP_TIE; a label in the group: LABEL_AMBIGUOUS and the
#     kept value), ties at the k-th value (TOPK_TIE: more than k kept), labels
#     outside the kept set (-inf, counted as 'dropped', exit 0), ignored rows
#   - every output within 1 ulp (f32) of the reference (+1e-12 relative for
#     the float64 reference), kept and the flags' bits exactly, the summary
#     line's counts; [B, S, V] logits give [B, S] outputs; f16 logits
#   - when the Python package loads ($BUILD/libxent.so), the outputs equal
#     xent.sampler_logprobs's bit for bit
#   - output names: o.npy -> o.NAME.npy (o.npy itself not written), one
#     .safetensors with the six names and dtypes; a conflicting name is
#     refused (exit 2) before any work
#   - exit codes: 2 for a flag out of range (the message names the flag), 1
#     for a label outside [0, V) (nothing written) and for a NaN logit (the
#     outputs written; 0 with --allow-nonfinite)
# Prints "N passed, N failed[, N skipped]" last. Needs numpy (else skipped).
BUILD=${BUILD:-build}
XENT="$BUILD/xent"
if [ ! -x "$XENT" ]; then echo "$XENT not built"; echo "0 passed, 0 failed, 1 skipped"; exit 0; fi
if ! python3 -c "import numpy" 2>/dev/null; then
    echo "numpy not installed: skipped"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
exec python3 - "$XENT" "$BUILD" <<'EOF'
import json, os, struct, subprocess, sys, tempfile
import numpy as np

xent = os.path.abspath(sys.argv[1])
build = os.path.abspath(sys.argv[2])
passed = failed = skipped = 0
NAMES = ("logprob", "logprob_full", "kept", "log_kept_mass", "entropy", "flags")
MINP_NEAR, TOPP_NEAR, TOPP_TIE, TOPK_TIE, LABEL_AMBIGUOUS = 1, 2, 4, 8, 16

def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
        print("ok  ", what)
    else:
        failed += 1
        print("FAIL", what)

def run(*args):
    e = dict(os.environ)
    e.pop("XENT_NUM_THREADS", None)
    return subprocess.run([xent, *args], capture_output=True, text=True, env=e)

def ulp32(x):
    x = np.abs(np.asarray(x, dtype=np.float64))
    return np.spacing(np.where(np.isfinite(x), x, 0).astype(np.float32)).astype(np.float64)

def reference(z, t, temp=1.0, top_k=0, top_p=1.0, min_p=0.0, ignore=-100, kept_as=None):
    """float64 reference of the rules of docs/sampler.md, by sorting. z [T, V]
    (values exactly the file's), t [T]. kept_as: per row, a kept count to use
    instead of the rule's (for rows the library flags as within rounding).
    Returns a dict of arrays like the CLI's outputs, plus "tie" (the label is
    in a partly kept tie group) and "dropped" (count)."""
    T, V = z.shape
    out = {n: np.zeros(T) for n in NAMES}
    out["kept"] = np.zeros(T, np.int64)
    out["tie"] = np.zeros(T, bool)
    dropped = 0
    for i in range(T):
        zi = z[i].astype(np.float64)
        d = (zi - zi.max()) / temp
        keep = np.ones(V, bool)
        if min_p > 0:
            keep &= d >= np.log(min_p)
        if 0 < top_k < keep.sum():
            kth = np.sort(np.where(keep, zi, -np.inf))[::-1][top_k - 1]
            keep &= zi >= kth
        order = np.argsort(-zi, kind="stable")
        order = order[keep[order]]
        w = np.exp(d[order])
        n = len(order)
        if top_p < 1:
            cum = np.cumsum(w)
            n = int(np.searchsorted(cum, top_p * cum[-1], side="left")) + 1
            n = min(n, len(order))
        if kept_as is not None and kept_as[i] >= 0:
            n = int(kept_as[i])
        cut = zi[order[n - 1]]
        group = order[zi[order] == cut]          # the tie group at the cut
        partly = n < len(order) and zi[order[n]] == cut
        K = order[:n]
        SK = np.exp(d[K]).sum()
        R = np.exp(d[order[n:]]).sum() + np.exp(d[~keep]).sum()
        out["kept"][i] = n
        out["log_kept_mass"][i] = -np.log1p(R / SK)
        out["entropy"][i] = np.log(SK) + (np.exp(d[K]) * -d[K]).sum() / SK
        if t[i] == ignore:
            continue
        full = np.exp(d).sum()
        out["logprob_full"][i] = d[t[i]] - np.log(full)
        inside = t[i] in set(K.tolist()) or (partly and t[i] in set(group.tolist()))
        out["tie"][i] = partly and t[i] in set(group.tolist())
        if inside:
            out["logprob"][i] = d[t[i]] - np.log(SK)
        else:
            out["logprob"][i] = -np.inf
            dropped += 1
    out["dropped"] = dropped
    return out

def load_out(stem):
    return {n: np.load(f"{stem}.{n}.npy") for n in NAMES}

def within(got, want):
    got = np.asarray(got, np.float64).reshape(-1)
    want = np.asarray(want, np.float64).reshape(-1)
    same_inf = np.isinf(want) & (got == want)
    ok = np.abs(got - want) <= ulp32(want) + 1e-12 * np.abs(want)
    return bool(np.all(same_inf | (np.isfinite(want) & ok)))

def summary(stdout):
    f = {}
    for tok in stdout.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            f[k] = v
    return f

def python_xent():
    """xent.sampler_logprobs from python/ with $BUILD/libxent.so, or None."""
    lib = os.path.join(build, "libxent.so")
    if not os.path.exists(lib):
        return None
    os.environ["XENT_LIBRARY"] = lib
    sys.path.insert(0, os.path.join(os.getcwd(), "python"))
    try:
        import xent as X
        X.sampler_logprobs(np.zeros((1, 2), np.float32), np.zeros(1, np.int64))
        return X
    except Exception as e:  # noqa: BLE001 (any failure: the cross-check is skipped)
        print("python xent not usable here:", e)
        return None

X = python_xent()

with tempfile.TemporaryDirectory() as d:
    rng = np.random.default_rng(46)
    V = 40
    # random rows with coarse values (ties), then hand-made rows
    rows = [np.round(rng.standard_normal(V) * 3 * 2) / 2 for _ in range(10)]
    rows += [rng.standard_normal(V) * 4 for _ in range(6)]
    b = np.full(V, -30.0); b[0] = 2.0; b[1] = 1.0; b[2:6] = 0.5  # boundary row (index 16)
    rows.append(b)
    tie = np.full(V, -20.0); tie[[3, 7, 11]] = 4.0; tie[5] = 1.0  # 3 equal dominate (17)
    rows.append(tie)
    tk = np.full(V, -5.0); tk[[0, 1]] = 5.0; tk[[2, 3, 4]] = 4.0  # top-k ties (18)
    rows.append(tk)
    z = np.array(rows, dtype=np.float32)
    T = z.shape[0]
    t = rng.integers(0, V, size=T).astype(np.int64)
    t[3] = -100
    t[16] = 1          # the second value: kept or not by the boundary
    t[17] = 7          # inside the 3-way tie group
    t[18] = 4          # a top-k tie member
    np.save(f"{d}/z.npy", z)
    np.save(f"{d}/t.npy", t)
    zb = z[16].astype(np.float64)
    e = np.exp(zb - zb.max())
    m1 = e[0] / e.sum()                        # top-1 mass of the boundary row

    cases = [
        ("temperature 0.7, top-p 0.9", dict(temp=0.7, top_p=0.9)),
        ("top-k 3 (ties)", dict(top_k=3)),
        ("temperature 1.3, top-k 5, top-p 0.8, min-p 0.05",
         dict(temp=1.3, top_k=5, top_p=0.8, min_p=0.05)),
        ("min-p 0.1", dict(min_p=0.1)),
        ("top-p 0.5 (the tie row's cut inside its group)", dict(top_p=0.5)),
        ("top-p = m1 (1 - 1e-9): boundary row keeps 1", dict(top_p=m1 * (1 - 1e-9))),
        ("top-p = m1 (1 + 1e-9): boundary row keeps 2", dict(top_p=m1 * (1 + 1e-9))),
        ("top-p = m1: boundary row within rounding", dict(top_p=m1)),
        ("no truncation", dict()),
    ]
    for k, (name, o) in enumerate(cases):
        args = ["logprobs", "--logits", f"{d}/z.npy", "--labels", f"{d}/t.npy", "--out", f"{d}/o{k}.npy"]
        flagmap = {"temp": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p"}
        for key, v in o.items():
            args += [flagmap[key], repr(float(v)) if key != "top_k" else str(v)]
        r = run(*args)
        check(r.returncode == 0, f"{name}: exit {r.returncode} {r.stderr.strip()}")
        if r.returncode:
            continue
        got = load_out(f"{d}/o{k}")
        near = (got["flags"] & (MINP_NEAR | TOPP_NEAR)) != 0
        ref = reference(z, t, **o, kept_as=np.where(near, got["kept"], -1))
        check(np.array_equal(got["kept"], ref["kept"]), f"{name}: kept {got['kept'].tolist()}")
        for n in ("logprob", "logprob_full", "log_kept_mass", "entropy"):
            check(within(got[n], ref[n]), f"{name}: {n} within 1 ulp of the float64 reference")
        amb = (got["flags"] & LABEL_AMBIGUOUS) != 0
        check(np.array_equal(amb & ~near, ref["tie"] & ~near) ,
              f"{name}: LABEL_AMBIGUOUS exactly on the rows whose label is in a partly kept tie group")
        s = summary(r.stdout)
        counted = int(np.sum(t != -100))
        check(s.get("counted") == str(counted) and s.get("dropped") == str(ref["dropped"])
              and s.get("nonfinite") == "0",
              f"{name}: summary counted={counted} dropped={ref['dropped']}: {r.stdout.strip()}")
        amb_rows = int(np.sum((got["flags"] & (MINP_NEAR | TOPP_NEAR | TOPP_TIE)) != 0))
        check(s.get("ambiguous") == str(amb_rows), f"{name}: summary ambiguous={amb_rows}")
        check(not os.path.exists(f"{d}/o{k}.npy"), f"{name}: o.npy itself not written")
        if X is not None:
            res = X.sampler_logprobs(z, t, temperature=o.get("temp", 1.0), top_k=o.get("top_k", 0),
                                     top_p=o.get("top_p", 1.0), min_p=o.get("min_p", 0.0))
            same = all(np.array_equal(np.asarray(getattr(res, n)), got[n]) for n in NAMES)
            check(same and res.n_dropped == ref["dropped"],
                  f"{name}: equals xent.sampler_logprobs bit for bit")
        # the hand-made rows
        if name.startswith("top-p 0.5"):
            f17 = int(got["flags"][17])
            check(got["kept"][17] == 2 and f17 & TOPP_TIE and f17 & LABEL_AMBIGUOUS
                  and np.isfinite(got["logprob"][17]),
                  f"{name}: tie row keeps 2 of 3 equal, flags {f17} (TIE, LABEL_AMBIGUOUS), label kept value")
        if name.startswith("top-k 3"):
            check(got["kept"][18] == 5 and got["flags"][18] & TOPK_TIE and np.isfinite(got["logprob"][18]),
                  f"{name}: top-k row keeps 5 (ties with the 3rd), flag TOPK_TIE")
        if "(1 - 1e-9)" in name:
            check(got["kept"][16] == 1 and got["flags"][16] == 0 and got["logprob"][16] == -np.inf,
                  f"{name}: kept 1, unflagged, the label (2nd) dropped: -inf")
        if "(1 + 1e-9)" in name:
            check(got["kept"][16] == 2 and got["flags"][16] == 0 and np.isfinite(got["logprob"][16]),
                  f"{name}: kept 2, unflagged, the label kept")
        if name.endswith("within rounding"):
            check(got["flags"][16] & TOPP_NEAR and got["kept"][16] in (1, 2),
                  f"{name}: flag TOPP_NEAR, kept {got['kept'][16]} (one side)")
        if name == "no truncation":
            check(np.all(got["kept"] == V) and np.all(got["log_kept_mass"] == 0)
                  and np.array_equal(got["logprob"], got["logprob_full"]),
                  f"{name}: every column kept, log_kept_mass 0, logprob == logprob_full")

    # [B, S, V] f16 logits, .safetensors output
    z3 = (rng.standard_normal((2, 3, 33)) * 3).astype(np.float16)
    t3 = rng.integers(0, 33, size=(2, 3)).astype(np.int32)
    np.save(f"{d}/z3.npy", z3)
    np.save(f"{d}/t3.npy", t3)
    r = run("logprobs", "--logits", f"{d}/z3.npy", "--labels", f"{d}/t3.npy", "--out", f"{d}/o3.safetensors",
            "--top-p", "0.7", "--temperature", "0.9")
    check(r.returncode == 0 and f"{d}/o3.safetensors" in r.stdout, f"[B, S, V] f16: exit {r.returncode} {r.stderr.strip()}")
    if r.returncode == 0:
        raw = open(f"{d}/o3.safetensors", "rb").read()
        hl = struct.unpack("<Q", raw[:8])[0]
        hdr = json.loads(raw[8:8 + hl])
        dts = {n: hdr[n]["dtype"] for n in NAMES if n in hdr}
        check(dts == {"logprob": "F32", "logprob_full": "F32", "kept": "I64", "log_kept_mass": "F32",
                      "entropy": "F32", "flags": "I32"} and all(hdr[n]["shape"] == [2, 3] for n in NAMES),
              f"[B, S, V]: one .safetensors, six [2, 3] tensors: {dts}")
        base = 8 + hl
        def tensor(n):
            a, b2 = hdr[n]["data_offsets"]
            dt = {"F32": np.float32, "I64": np.int64, "I32": np.int32}[hdr[n]["dtype"]]
            return np.frombuffer(raw[base + a:base + b2], dtype=dt)
        ref = reference(z3.reshape(6, 33).astype(np.float32), t3.reshape(6), temp=0.9, top_p=0.7)
        check(np.array_equal(tensor("kept"), ref["kept"]) and within(tensor("logprob"), ref["logprob"])
              and within(tensor("entropy"), ref["entropy"]), "[B, S, V] f16: kept, logprob, entropy match")

    # ---- usage errors (exit 2) and bad data (exit 1) -------------------------
    base_args = ["logprobs", "--logits", f"{d}/z.npy", "--labels", f"{d}/t.npy", "--out", f"{d}/u.npy"]
    for flag, val, want in (("--top-p", "0", "--top-p expects a number in (0, 1], got '0'"),
                            ("--top-p", "1.5", "--top-p expects"),
                            ("--min-p", "1", "--min-p expects a number in [0, 1), got '1'"),
                            ("--top-k", "-1", "--top-k expects"),
                            ("--temperature", "0", "--temperature expects"),
                            ("--boundary-tol", "1", "--boundary-tol expects")):
        r = run(*base_args, flag, val)
        check(r.returncode == 2 and want in r.stderr and r.stderr.startswith("xent logprobs: "),
              f"{flag} {val}: exit 2 naming the flag: {r.stderr.strip()}")
    r = run("logprobs", "--logits", f"{d}/z.npy", "--labels", f"{d}/t.npy", "--out", f"{d}/u.txt")
    check(r.returncode == 2 and "--out must end in .safetensors or .npy" in r.stderr, "--out u.txt: exit 2")
    r = run("logprobs", "--logits", f"{d}/z.npy", "--labels", f"{d}/o0.logprob.npy", "--out", f"{d}/o0.npy")
    check(r.returncode == 2 and "--out" in r.stderr and "--labels" in r.stderr,
          f"an output that is an input: exit 2 before any work: {r.stderr.strip()}")
    r = run("logprobs", "--logits", f"{d}/z.npy", "--labels", f"{d}/t.npy", "--out", f"{d}/nodir/o.npy")
    check(r.returncode == 2, f"--out in a missing directory: exit 2: {r.stderr.strip()}")
    bad = t.copy(); bad[5] = V
    np.save(f"{d}/bad.npy", bad)
    r = run("logprobs", "--logits", f"{d}/z.npy", "--labels", f"{d}/bad.npy", "--out", f"{d}/b.npy")
    check(r.returncode == 1 and "labels[5]" in r.stderr and "--labels" in r.stderr
          and not os.path.exists(f"{d}/b.logprob.npy"),
          f"a label outside [0, V): exit 1, nothing written: {r.stderr.strip()}")
    zn = z.copy(); zn[2, 4] = np.nan
    np.save(f"{d}/zn.npy", zn)
    r = run("logprobs", "--logits", f"{d}/zn.npy", "--labels", f"{d}/t.npy", "--out", f"{d}/n.npy")
    ok = r.returncode == 1 and "nonfinite=1" in r.stdout and "--allow-nonfinite" in r.stderr
    if ok:
        lp = np.load(f"{d}/n.logprob.npy")
        ok = np.isnan(lp[2]) and np.isfinite(lp[0])
    check(ok, f"a NaN logit: outputs written (NaN on that row), exit 1: {r.stderr.strip()}")
    r = run("logprobs", "--logits", f"{d}/zn.npy", "--labels", f"{d}/t.npy", "--out", f"{d}/n.npy",
            "--allow-nonfinite")
    check(r.returncode == 0, "a NaN logit with --allow-nonfinite: exit 0")
    r = run("logprobs", "--help")
    check(r.returncode == 0 and all(f in r.stdout for f in ("--top-k K", "--top-p P", "--min-p P",
                                                             "--temperature", "FILE.logprob.npy"))
          and "dropped" in r.stdout, "--help names the flags and the outputs")
    if X is None:
        skipped += 1
        print("skip  the Python cross-check (python/xent with $BUILD/libxent.so not usable)")

print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
sys.exit(1 if failed else 0)
EOF
