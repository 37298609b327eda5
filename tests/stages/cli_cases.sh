#!/bin/sh
# tests/stages/cli_cases.sh: the command line as a user meets it, run on the
# xent binary:
#   - every command: --help exits 0 and shows each flag with its default or
#     "(required)"; an unknown flag, a bad value, a missing value exit 2 with
#     a message naming the flag and the value; bad data exits 1
#   - a non-finite loss (ce) or statistic (compare) exits 1, 0 with
#     --allow-nonfinite
#   - bf16 .npy written by numpy + ml_dtypes ('<V2') and f64 .npy logits are
#     read: the outputs equal those of the same values as bf16 .safetensors
#     and as f32 (f64 rounded once)
#   - `xent rl` and `xent compare` show the same defaults (xent_rl_loss_opts_init)
#   - output names: --out o.npy writes o.NAME.npy and says so; a conflicting
#     name is refused (exit 2) before any work
#   - the progress line: on a terminal (a pty) after XENT_PROGRESS_AFTER
#     seconds, not under --quiet, not when stderr is a file
#   - XENT_NUM_THREADS is read by the CLI at startup
# Prints "N passed, N failed[, N skipped]" last. Needs numpy (else skipped);
# the bf16 case needs ml_dtypes (else that case is skipped).
BUILD=${BUILD:-build}
XENT="$BUILD/xent"
if [ ! -x "$XENT" ]; then echo "$XENT not built"; echo "0 passed, 0 failed, 1 skipped"; exit 0; fi
if ! python3 -c "import numpy" 2>/dev/null; then
    echo "numpy not installed: skipped"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
exec python3 - "$XENT" <<'EOF'
import json, os, pty, re, select, struct, subprocess, sys, tempfile, time
import numpy as np

xent = os.path.abspath(sys.argv[1])
passed = failed = skipped = 0

def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
        print("ok  ", what)
    else:
        failed += 1
        print("FAIL", what)

def run(*args, env=None):
    e = dict(os.environ)
    e.pop("XENT_NUM_THREADS", None)
    e.update(env or {})
    return subprocess.run([xent, *args], capture_output=True, text=True, env=e)

def run_pty(args, env=None, timeout=120):
    """Runs xent with stderr (and stdout) on a pseudo-terminal; returns (rc, text)."""
    e = dict(os.environ)
    e.update(env or {})
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(xent, [xent, *args], e)
    out = b""
    t0 = time.time()
    while time.time() - t0 < timeout:
        r, _, _ = select.select([fd], [], [], 0.5)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    _, st = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(st), out.decode(errors="replace")

def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, shape, raw bytes)."""
    hdr, off, blobs = {}, 0, []
    for name, (dt, shape, raw) in tensors.items():
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

def bf16_bits(x32):
    """float32 array -> uint16 bf16 bits, round to nearest even."""
    u = x32.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

with tempfile.TemporaryDirectory() as d:
    rng = np.random.default_rng(7)
    z = (rng.standard_normal((6, 40)) * 4).astype(np.float32)
    t = rng.integers(0, 40, size=6).astype(np.int64)
    np.save(f"{d}/z.npy", z)
    np.save(f"{d}/t.npy", t)
    lp = -np.abs(rng.standard_normal(64)).astype(np.float32) - 0.01
    np.save(f"{d}/lp.npy", lp)
    np.save(f"{d}/lp2.npy", (lp - 0.01).astype(np.float32))

    # ---- help and usage errors, every command -------------------------------
    for cmd in ("ce", "logprobs", "rl", "compare", "audit", "model", "sweep", "bench"):
        r = run(cmd, "--help")
        lines = r.stdout.split("\n")
        flags = [l for l in lines if l.startswith("  --")]
        ok = r.returncode == 0 and flags and "exit status: 0 success" in r.stdout
        for i, l in enumerate(lines):
            if not l.startswith("  --"):
                continue
            block = l
            for m in lines[i + 1:]:
                if not m.startswith("    "):
                    break
                block += m
            ok = ok and ("(default: " in block or "(required)" in block or l.startswith("  --out PATH"))
        check(ok, f"{cmd} --help: exit {r.returncode}, {len(flags)} flags each with its default")
        r = run(cmd, "--no-such-flag")
        check(r.returncode == 2 and "unknown flag '--no-such-flag'" in r.stderr
              and r.stderr.startswith(f"xent {cmd}: "), f"{cmd}: unknown flag exits 2: {r.stderr.strip()}")
    usage = [
        (["ce", "--logits", "a", "--labels", "b", "--out", "o.npy", "--label-smoothing", "2"],
         "--label-smoothing expects a number in [0, 1], got '2'"),
        (["ce", "--logits", "a", "--labels", "b", "--out", "o.npy", "--temperature=0"],
         "--temperature expects a number > 0, got '0'"),
        (["ce", "--logits", "a", "--labels", "b", "--out"], "--out needs a value"),
        (["ce", "--logits", "a", "--labels", "b", "--out", "--grad"], "--out needs a value, got the flag '--grad'"),
        (["ce", "--logits", "a", "--labels", "b", "--out", "o.npy", "--reduction", "avg"],
         "--reduction got 'avg'; accepted: none, sum, mean"),
        (["ce", "--labels", "b", "--out", "o.npy"], "--logits is required"),
        (["rl", "--new", "x.npy", "--clamp", "100"], "--clamp expects a number in (0, 80], got '100'"),
        (["rl", "--new", "x.npy", "--zero-run", "-1"], "--zero-run expects an integer >= 0, got '-1'"),
        (["compare", "a", "b", "--eps", "1.5"], "--eps expects a number in (0, 1), got '1.5'"),
        (["compare", "a"], "takes two log-prob files A and B, got 1 argument"),
        (["audit", "--seq-len", "0"], "--seq-len expects an integer >= 1, got '0'"),
        (["audit", "--device", "tpu"], "--device got 'tpu'; accepted: cpu, cuda"),
        (["model", "info"], "xent model: "),
        (["model", "fly", "m.gguf"], "unknown action 'fly'"),
        (["sweep", "--vocab", "1"], "--vocab expects an integer in [2, 2.14748e+09], got '1'"),
        (["sweep", "--margins", "1,x"], "--margins expects a finite number, got 'x'"),
        (["bench", "--threads", "0"], "--threads expects integers in [1, 256], got '0'"),
        (["bench", "--dtype", "f64"], "--dtype got 'f64'; accepted: bf16, f16, f32"),
    ]
    for args, needle in usage:
        r = run(*args)
        check(r.returncode == 2 and needle in r.stderr, f"{' '.join(args)}: exit {r.returncode}, {r.stderr.strip()}")
    # bad data: exit 1
    np.save(f"{d}/bad_t.npy", np.full(6, 99, dtype=np.int64))
    r = run("ce", "--logits", f"{d}/z.npy", "--labels", f"{d}/bad_t.npy", "--out", f"{d}/o.npy")
    check(r.returncode == 1 and "--labels" in r.stderr, f"ce: label out of range exits 1: {r.stderr.strip()}")
    r = run("rl", "--new", f"{d}/missing.npy")
    check(r.returncode == 1 and "--new" in r.stderr, f"rl: missing file exits 1: {r.stderr.strip()}")
    np.save(f"{d}/pos.npy", np.abs(lp))
    r = run("rl", "--new", f"{d}/pos.npy")
    check(r.returncode == 1, f"rl: positive log-probs exit 1: {r.stderr.strip()}")

    # ---- non-finite results -------------------------------------------------
    zn = z.copy(); zn[2, 5] = np.nan
    np.save(f"{d}/zn.npy", zn)
    r = run("ce", "--logits", f"{d}/zn.npy", "--labels", f"{d}/t.npy", "--out", f"{d}/n.npy")
    check(r.returncode == 1 and "--allow-nonfinite" in r.stderr and os.path.exists(f"{d}/n.loss.npy"),
          f"ce: NaN loss exits 1 (outputs written): {r.stderr.strip()}")
    r = run("ce", "--logits", f"{d}/zn.npy", "--labels", f"{d}/t.npy", "--out", f"{d}/n.npy", "--allow-nonfinite")
    check(r.returncode == 0 and "nonfinite=1" in r.stdout, f"ce --allow-nonfinite: exit {r.returncode}")
    with open(f"{d}/huge.txt", "w") as f:
        f.write("-1e300\n-2e300\n-1\n")
    with open(f"{d}/small.txt", "w") as f:
        f.write("-1\n-1\n-1\n")
    r = run("compare", f"{d}/huge.txt", f"{d}/small.txt", "--quiet", "--bootstrap", "0")
    check(r.returncode == 1 and "not finite" in r.stderr and "--allow-nonfinite" in r.stderr,
          f"compare: overflowing statistic exits 1: {r.stderr.strip()}")
    r = run("compare", f"{d}/huge.txt", f"{d}/small.txt", "--quiet", "--bootstrap", "0",
            "--allow-nonfinite", "--json", f"{d}/h.json")
    check(r.returncode == 0 and json.load(open(f"{d}/h.json"))["delta"]["rms"] is None,
          f"compare --allow-nonfinite: exit {r.returncode} {r.stderr.strip()}")

    # ---- bf16 (ml_dtypes) and f64 inputs ------------------------------------
    try:
        import ml_dtypes
    except ImportError:
        ml_dtypes = None
    if ml_dtypes is None:
        skipped += 1
        print("skip bf16 .npy: ml_dtypes not installed (pip install ml_dtypes)")
    else:
        zb = z.astype(ml_dtypes.bfloat16)
        np.save(f"{d}/zb.npy", zb)
        with open(f"{d}/zb.npy", "rb") as f:
            head = f.read(128)
        check(b"'descr': '<V2'" in head, f"ml_dtypes writes descr '<V2': {head[10:60]}")
        write_safetensors(f"{d}/zb.safetensors",
                          {"logits": ("BF16", z.shape, bf16_bits(z).tobytes())})
        check(np.array_equal(bf16_bits(z), zb.view(np.uint16)), "bf16 rounding matches ml_dtypes")
        outs = {}
        for name, src in (("npy", f"{d}/zb.npy"), ("st", f"{d}/zb.safetensors")):
            r = run("ce", "--logits", src, "--labels", f"{d}/t.npy", "--out", f"{d}/b_{name}.npy",
                    "--grad", "--grad-dtype", "f32")
            check(r.returncode == 0, f"ce bf16 logits from {name}: exit {r.returncode} {r.stderr.strip()}")
            outs[name] = {k: np.load(f"{d}/b_{name}.{k}.npy") for k in ("nll", "lse", "grad")}
        if len(outs) == 2:
            check(all(np.array_equal(outs["npy"][k], outs["st"][k]) for k in outs["npy"]),
                  "'<V2' .npy logits give the bits of the same bf16 .safetensors")
        np.save(f"{d}/lpb.npy", lp.astype(ml_dtypes.bfloat16))
        r = run("rl", "--new", f"{d}/lpb.npy")
        check(r.returncode == 0 and "checked 64" in r.stdout, f"rl reads a '<V2' .npy: {r.stderr.strip()}")
    z64 = (rng.standard_normal((6, 40)) * 4).astype(np.float64)
    np.save(f"{d}/z64.npy", z64)
    np.save(f"{d}/z64as32.npy", z64.astype(np.float32))
    res = []
    for src in ("z64", "z64as32"):
        r = run("ce", "--logits", f"{d}/{src}.npy", "--labels", f"{d}/t.npy", "--out", f"{d}/{src}o.npy",
                "--grad")
        check(r.returncode == 0, f"ce {src}: exit {r.returncode} {r.stderr.strip()}")
        res.append({k: np.load(f"{d}/{src}o.{k}.npy") for k in ("nll", "lse", "grad")})
    check(all(np.array_equal(res[0][k], res[1][k]) for k in res[0]) and res[0]["grad"].dtype == np.float32,
          "f64 logits = the same values rounded once to f32 (grad f32)")
    r = run("ce", "--help")
    check("f64 logits are rounded once to f32" in r.stdout, "ce --help states the f64 rounding")

    # ---- one set of defaults for rl and compare -----------------------------
    def defaults(cmd, flags):
        h = run(cmd, "--help").stdout
        out = {}
        for f in flags:
            m = re.search(r"\n  " + re.escape(f) + r" .*?\(default: ([^)]*)\)", h, re.S)
            out[f] = m.group(1) if m else None
        return out
    dr = defaults("rl", ["--eps-low", "--eps-high", "--clamp", "--zero-run"])
    dc = defaults("compare", ["--eps", "--eps-high", "--clamp", "--zero-run"])
    check(dr["--eps-low"] == dc["--eps"] == "0.2" and dr["--eps-high"] == dc["--eps-high"] == "0.2"
          and dr["--clamp"] == dc["--clamp"] == "20" and dr["--zero-run"] == dc["--zero-run"] == "32",
          f"rl and compare defaults agree: {dr} {dc}")
    r = run("compare", f"{d}/lp.npy", f"{d}/lp2.npy", "--json", "-", "--quiet", "--bootstrap", "0")
    o = json.loads(r.stdout)["options"] if r.returncode == 0 else {}
    check(o.get("eps") == 0.2 and o.get("eps_high") == 0.2 and o.get("zero_run") == 32,
          f"compare runs with them: {o}")
    zr = lp.copy(); zr[10:30] = 0  # a run of 20 zeros: below 32, accepted by both
    np.save(f"{d}/zr.npy", zr)
    r1 = run("rl", "--new", f"{d}/zr.npy")
    r2 = run("compare", f"{d}/zr.npy", f"{d}/lp2.npy", "--quiet", "--bootstrap", "0")
    r3 = run("rl", "--new", f"{d}/zr.npy", "--zero-run", "16")
    r4 = run("compare", f"{d}/zr.npy", f"{d}/lp2.npy", "--quiet", "--zero-run", "16")
    check((r1.returncode, r2.returncode, r3.returncode, r4.returncode) == (0, 0, 1, 1),
          f"a zero run of 20: accepted by both at the default, refused by both at 16: "
          f"{r1.returncode} {r2.returncode} {r3.returncode} {r4.returncode}")

    # ---- output names --------------------------------------------------------
    r = run("ce", "--logits", f"{d}/z.npy", "--labels", f"{d}/t.npy", "--out", f"{d}/o.npy")
    check(r.returncode == 0 and all(os.path.exists(f"{d}/o.{k}.npy") for k in ("loss", "nll", "logprob", "lse"))
          and not os.path.exists(f"{d}/o.npy") and "o.{loss,nll,logprob,lse}.npy" in r.stdout,
          f"--out o.npy writes o.NAME.npy and says so: {r.stdout.strip()}")
    check("FILE.loss.npy" in run("ce", "--help").stdout, "ce --help states the .npy naming")
    before = os.path.getmtime(f"{d}/z.npy")
    np.save(f"{d}/w.lse.npy", z)  # an input named like an output
    r = run("ce", "--logits", f"{d}/w.lse.npy", "--labels", f"{d}/t.npy", "--out", f"{d}/w.npy")
    check(r.returncode == 2 and "would write" in r.stderr and "--logits" in r.stderr
          and not os.path.exists(f"{d}/w.nll.npy"), f"ce: output over an input refused first: {r.stderr.strip()}")
    r = run("ce", "--logits", f"{d}/z.npy", "--labels", f"{d}/t.npy", "--out", f"{d}/nodir/o.npy")
    check(r.returncode == 2 and "does not exist" in r.stderr, f"ce: missing output dir: {r.stderr.strip()}")
    r = run("compare", f"{d}/lp.npy", f"{d}/lp2.npy", "--json", f"{d}/lp.npy")
    check(r.returncode == 2 and "--json" in r.stderr and os.path.getmtime(f"{d}/z.npy") == before,
          f"compare: --json over input A refused: {r.stderr.strip()}")
    r = run("compare", f"{d}/lp.npy", f"{d}/lp2.npy", "--json", f"{d}/r.x", "--html", f"{d}/r.x")
    check(r.returncode == 2 and "--json and --html both write" in r.stderr, f"compare: same output twice: {r.stderr.strip()}")
    r = run("audit", "--model", "tests/data/model/tiny.gguf", "--json", f"{d}/nodir/a.json")
    check(r.returncode == 2 and "--json" in r.stderr, f"audit: --json checked before the run: {r.stderr.strip()}")

    # ---- text inputs that would block: a FIFO is refused, never read -------------
    # (a tiny Gemma 2 checkpoint with a tokenizer: tests/families/make_families.py)
    fifo = f"{d}/fifo"
    os.mkfifo(fifo)
    subprocess.run([sys.executable, "tests/families/make_families.py", f"{d}/fam", "gemma2"],
                   capture_output=True, check=True)
    gem = f"{d}/fam/gemma2"
    for args, flag in ((["audit", "--model", gem, "--text", fifo], "--text"),
                       (["audit", "--model", gem, "--variants", fifo], "--variants"),
                       (["model", "tokenize", gem, "--file", fifo], "--file")):
        try:
            r = subprocess.run([xent, *args], capture_output=True, text=True, timeout=20)
            ok = r.returncode in (1, 2) and flag in r.stderr and "not a regular file" in r.stderr
            msg = r.stderr.strip()
        except subprocess.TimeoutExpired:
            ok, msg = False, "blocked on the FIFO (killed after 20 s)"
        check(ok, f"{args[0]} {flag} FIFO refused without blocking: {msg}")

    # ---- progress line ---------------------------------------------------------
    tiny = os.path.abspath("tests/data/model/tiny.gguf")
    if not os.path.exists(tiny):
        skipped += 1
        print("skip progress: tests/data/model/tiny.gguf missing")
    else:
        args = ["audit", "--model", tiny, "--seq-len", "8", "--variant", "fp32", "--variant", "bf16"]
        rc, text = run_pty(args, {"XENT_PROGRESS_AFTER": "0"})
        check(rc == 0 and re.search(r"xent audit: \d+/\d+ layer passes.*elapsed, ETA", text) is not None
              and "\x1b[K" in text, f"audit on a terminal draws the progress line: {text[-300:]!r}")
        rc, text = run_pty(args + ["--quiet"], {"XENT_PROGRESS_AFTER": "0"})
        check(rc == 0 and "ETA" not in text, "audit --quiet on a terminal: no progress line")
        rc, text = run_pty(args, {"XENT_PROGRESS_AFTER": "1000"})
        check(rc == 0 and "ETA" not in text and "[2/2] bf16" in text, "a step shorter than the delay: no line, the log lines stay")
        r = run(*args, env={"XENT_PROGRESS_AFTER": "0"})
        check(r.returncode == 0 and "ETA" not in r.stderr and "[2/2] bf16" in r.stderr,
              "audit with stderr not a terminal: log lines only")

    # ---- XENT_NUM_THREADS -------------------------------------------------------
    r = run("--version", env={"XENT_NUM_THREADS": "3"})
    check(r.returncode == 0 and "threads 3 " in r.stdout, f"XENT_NUM_THREADS=3: {r.stdout.strip()}")
    r = run("ce", "--help", env={"XENT_NUM_THREADS": "lots"})
    check(r.returncode == 2 and "XENT_NUM_THREADS expects an integer" in r.stderr and "'lots'" in r.stderr,
          f"bad XENT_NUM_THREADS: {r.stderr.strip()}")

print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
EOF
