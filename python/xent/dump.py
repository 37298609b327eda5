"""Per-token log-prob dumps in one JSON Lines schema, for `xent compare`.

One line per sequence (docs/compare.md, "Dump schema"):

    {"schema": "xent.dump/1", "tokens": [...], "logprobs": [null, ...],
     "prompt_len": k, "engine": "...", "dtype": "...", "model": "...", ...}

logprobs[i] is the natural log of p(tokens[i] | tokens[:i]); logprobs[0] is
null (no context). Positions i < prompt_len are prompt: `xent compare`
leaves them out of every statistic, so they may be null. Producers:

    python -m xent.dump hf --model DIR|FILE.gguf --text FILE --dtype bf16 \
        --out A.jsonl                   # Hugging Face transformers forward
    python -m xent.dump audit audit.json --variant fp32 --out X.jsonl
                                        # xent's own model (`xent audit`)
    xent.dump.from_vllm(request_outputs)    # vLLM RequestOutput objects
    xent.dump.from_trl(batch, field)        # TRL GRPOTrainer batch dicts
    xent.dump.from_verl(data, field)        # verl DataProto / TensorDict

Only numpy is needed to build and write records; torch and transformers are
imported by the `hf` producer alone.
"""
import argparse
import json
import math
import os
import sys
import tempfile

import numpy as np

SCHEMA = "xent.dump/1"

__all__ = ["SCHEMA", "make_record", "write_jsonl", "read_jsonl",
           "read_token_sequences", "load_hf", "hf_records", "from_vllm",
           "from_trl", "from_verl", "from_audit", "main"]


# ---- records -------------------------------------------------------------

def _num(x):
    """A log-prob as a JSON value: float, None for a missing one (None or
    NaN); +-inf stays (Python's json writes Infinity / -Infinity)."""
    if x is None:
        return None
    v = float(x)
    return None if math.isnan(v) else v


def _ints(xs):
    return [int(t) for t in np.asarray(xs).reshape(-1).tolist()]


def make_record(tokens, logprobs, prompt_len, **meta):
    """One sequence as a schema dict. tokens: ids; logprobs: one value (or
    None) per token, logprobs[i] = log p(tokens[i] | tokens[:i]);
    prompt_len: the first prompt_len tokens are prompt. A missing value
    (None or NaN) after the prompt is refused: `xent compare` would count it
    as a bad log-prob (pass allow_missing=True to write it anyway). Extra
    keyword arguments are metadata keys (None values are left out)."""
    allow_missing = meta.pop("allow_missing", False)
    toks = _ints(tokens)
    lps = [_num(v) for v in (logprobs.tolist() if hasattr(logprobs, "tolist")
                             else logprobs)]
    if len(lps) != len(toks):
        raise ValueError("tokens has %d entries but logprobs has %d"
                         % (len(toks), len(lps)))
    pl = int(prompt_len)
    if not 0 <= pl <= len(toks):
        raise ValueError("prompt_len = %d is outside [0, %d]" % (pl, len(toks)))
    if not allow_missing:
        miss = [i for i in range(pl, len(lps)) if lps[i] is None]
        if miss:
            raise ValueError("logprobs[%d] (after the prompt, prompt_len = %d) "
                             "is missing" % (miss[0], pl))
    rec = {"schema": SCHEMA, "tokens": toks, "logprobs": lps, "prompt_len": pl}
    for k, v in meta.items():
        if v is None:
            continue
        if k in rec:
            raise ValueError("metadata key %r is a schema key" % k)
        if isinstance(v, np.ndarray) or hasattr(v, "detach"):
            v = [_num(x) for x in np.asarray(_np(v)).reshape(-1).tolist()]
        rec[k] = v
    return rec


def write_jsonl(records, path):
    """Writes the records, one JSON object per line ('-' = stdout). A file
    is written to a temporary name beside it and renamed when complete: an
    interrupted or failed dump leaves any earlier file untouched."""
    if path == "-":
        for r in records:
            sys.stdout.write(json.dumps(r, separators=(",", ":")) + "\n")
        return
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_jsonl(path):
    """The records of a dump (one object per non-blank line)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_token_sequences(path):
    """Token-id sequences and their prompt lengths (None where unknown) from
    a dump (JSONL), an `xent audit` JSON ("tokens": [[...]]), a JSON array
    of arrays, or text with one integer per line (one sequence)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    s = text.lstrip()
    if s.startswith("{") or s.startswith("["):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None          # JSON Lines
        if doc is None:
            recs = [json.loads(l) for l in text.splitlines() if l.strip()]
            return ([_ints(r["tokens"]) for r in recs],
                    [r.get("prompt_len") for r in recs])
        if isinstance(doc, dict) and "logprobs" in doc:
            return [_ints(doc["tokens"])], [doc.get("prompt_len")]
        toks = doc["tokens"] if isinstance(doc, dict) else doc
        if toks and not isinstance(toks[0], list):
            toks = [toks]
        return [_ints(t) for t in toks], [None] * len(toks)
    return [[int(l) for l in text.split()]], [None]


def _np(x):
    """A torch tensor or array-like as a NumPy array (CPU; bf16 as f32)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(x.dtype) in ("torch.bfloat16", "torch.float16"):
            x = x.float()
        return x.numpy()
    return np.asarray(x)


# ---- Hugging Face transformers -------------------------------------------

_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16",
                 "fp64": "float64"}


def _fix_gguf_pretokenizer(tok, path):
    """transformers builds a GGUF's BPE tokenizer with the byte-level
    pre-tokenizer alone, whatever `tokenizer.ggml.pre` says. For the
    pre-types whose model splits digits one by one before the byte-level
    step (llama.cpp's "smollm": SmolLM/SmolLM2's tokenizer.json), put the
    digit split back, so that the ids equal the model's own tokenizer's
    (and xent's: `xent audit` reads the same GGUF)."""
    try:
        from gguf import GGUFReader
        from tokenizers import pre_tokenizers as pt
    except ImportError:
        return
    field = GGUFReader(path).fields.get("tokenizer.ggml.pre")
    if field is None:
        return
    pre = bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    backend = getattr(tok, "backend_tokenizer", None)
    if pre == "smollm" and backend is not None:
        backend.pre_tokenizer = pt.Sequence([
            pt.Digits(individual_digits=True),
            pt.ByteLevel(add_prefix_space=False, use_regex=True)])


def load_hf(model, dtype="fp32", offline=True, tokenizer=True):
    """(model, tokenizer) from a local directory or a .gguf file (through
    transformers' gguf_file=, which needs the `gguf` and `accelerate`
    packages), weights cast to dtype (fp32, bf16, fp16, fp64), eval mode.
    tokenizer=False: no tokenizer is loaded (None is returned for it)."""
    import torch
    if offline:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tdt = getattr(torch, _TORCH_DTYPES[dtype])
    kw = {"local_files_only": True} if offline else {}
    if model.endswith(".gguf") and os.path.isfile(model):
        d, f = os.path.split(os.path.abspath(model))
        kw["gguf_file"] = f
    else:
        d = model
    tok = AutoTokenizer.from_pretrained(d, **kw) if tokenizer else None
    if tok is not None and "gguf_file" in kw:
        _fix_gguf_pretokenizer(tok, model)
    # GGUF weights are dequantized to fp32; other dtypes are a cast of that.
    m = AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32 if "gguf_file" in kw else tdt, **kw)
    m = m.to(tdt).eval()
    return m, tok


def hf_records(model, sequences, prompt_lens=None, *, dtype=None,
               logprobs="xent", sampling=None, model_name=None):
    """Runs each token sequence through a transformers causal LM (no
    batching, no padding: one forward per sequence) and returns the records.

    The logits come from the model in its own dtype (bf16 logits for a bf16
    model). "logprobs" holds, per `logprobs`:
      xent       xent.logprobs on those logits (exact log-softmax, 1 ulp of
                 the float32 result); fp64 logits: torch's float64
                 log_softmax (error ~1e-16, far below float32's ulp)
      engine     torch.log_softmax in the logits' dtype, as naive trainer
                 code computes it (bf16 logits give bf16 log-probs)
      processed  xent.sampler_logprobs under `sampling` (needs it)
    "engine_logprobs" (the engine's own) is always written next to it when
    logprobs="xent"; "processed_logprobs" whenever sampling is given.
    sampling: dict with temperature, top_k, top_p, min_p (vLLM's sampler
    order and rules, docs/sampler.md)."""
    import torch
    import xent
    if logprobs not in ("xent", "engine", "processed"):
        raise ValueError("logprobs must be 'xent', 'engine' or 'processed'")
    if logprobs == "processed" and not sampling:
        raise ValueError("logprobs='processed' needs sampling parameters")
    p = next(model.parameters())
    dname = dtype or {v: k for k, v in _TORCH_DTYPES.items()}.get(
        str(p.dtype).replace("torch.", ""), str(p.dtype))
    try:
        import transformers
        tver = transformers.__version__
    except ImportError:
        tver = None
    attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
    out = []
    for q, seq in enumerate(sequences):
        ids = torch.tensor([int(t) for t in seq], dtype=torch.long)
        if ids.numel() < 2:
            raise ValueError("sequence %d has %d token(s): at least 2 are "
                             "needed" % (q, ids.numel()))
        with torch.no_grad():
            logits = model(input_ids=ids[None].to(p.device)).logits[0]
        logits = logits[:-1].detach().cpu().contiguous()      # [S-1, V]
        lab = ids[1:]
        eng = torch.log_softmax(logits, dim=-1).gather(
            -1, lab[:, None])[:, 0]
        if logits.dtype == torch.float64:
            exact = eng
        else:
            exact = xent.logprobs(logits, lab)
        meta = {"engine": "transformers", "engine_version": tver,
                "dtype": dname, "logits_dtype": str(logits.dtype)
                .replace("torch.", ""), "attn_implementation": attn,
                "model": model_name, "logprobs_mode": "raw"}
        proc = None
        if sampling:
            if logits.dtype == torch.float64:
                raise ValueError("processed log-probs need fp32, bf16 or "
                                 "fp16 logits (xent.sampler_logprobs)")
            sp = {k: sampling.get(k, d) for k, d in (
                ("temperature", 1.0), ("top_k", 0), ("top_p", 1.0),
                ("min_p", 0.0))}
            r = xent.sampler_logprobs(logits, lab, **sp)
            proc = [None] + _np(r.logprob).tolist()
            meta.update(sampling=sp, processed_dropped=int(r.n_dropped),
                        processed_ambiguous=int(r.n_ambiguous))
        ex = [None] + _np(exact).tolist()
        en = [None] + _np(eng).tolist()
        if logprobs == "xent":
            main, meta["logprobs_source"] = ex, "xent exact log-softmax" + (
                " (float64 torch)" if logits.dtype == torch.float64 else "")
            meta["engine_logprobs"] = en
        elif logprobs == "engine":
            main, meta["logprobs_source"] = en, "engine log_softmax (%s)" % (
                meta["logits_dtype"])
        else:
            main, meta["logprobs_source"] = proc, "xent.sampler_logprobs"
            meta["logprobs_mode"] = "processed"
        if proc is not None and logprobs != "processed":
            meta["processed_logprobs"] = proc
        pl = 1 if prompt_lens is None or prompt_lens[q] is None \
            else max(1, int(prompt_lens[q]))
        out.append(make_record(ids, main, pl, allow_missing=(
            logprobs == "processed"), **meta))
    return out


# ---- vLLM ------------------------------------------------------------------

def _chosen(pos, tok, where):
    """The log-prob of token tok in one position's {token_id: Logprob}."""
    if pos is None:
        raise ValueError("%s: no log-probs at this position" % where)
    ent = pos.get(tok) if hasattr(pos, "get") else None
    if ent is None:
        ent = pos.get(str(tok)) if hasattr(pos, "get") else None
    if ent is None:
        raise ValueError("%s: token %d is not among the %d returned "
                         "log-probs" % (where, tok, len(pos)))
    return float(getattr(ent, "logprob", ent))


_VLLM_MODES = ("raw_logprobs", "processed_logprobs")


def from_vllm(request_outputs, *, logprobs_mode="raw_logprobs",
              score_prompt=False, model=None, dtype=None, **meta):
    """Records from vLLM RequestOutput objects (vllm/outputs.py):
    RequestOutput.prompt_token_ids, .prompt_logprobs (one {token_id:
    Logprob} per prompt token, None first) and .outputs, a list of
    CompletionOutput with .token_ids and .logprobs (one {token_id: Logprob}
    per generated token; Logprob.logprob, vllm/logprobs.py). The chosen
    token's entry is looked up by id (vLLM always includes it).

    One record per completion: tokens = prompt + completion, prompt_len =
    len(prompt); the prompt's values come from prompt_logprobs when they
    were asked for (SamplingParams(prompt_logprobs=0)), else null; the
    completion's from CompletionOutput.logprobs (SamplingParams(logprobs=0)).
    score_prompt=True: one record per request over the prompt alone,
    prompt_len = 1, from prompt_logprobs (teacher forcing a text).

    logprobs_mode: the engine's LLM(logprobs_mode=...): raw_logprobs (the
    default: log_softmax of the raw logits) or processed_logprobs (after
    temperature, top-k/top-p/min-p); the *_logits modes hold logits, not
    log-probs, and are refused. Written as "logprobs_mode": "raw" or
    "processed" (processed applies to the sample log-probs)."""
    if logprobs_mode not in _VLLM_MODES:
        raise ValueError("logprobs_mode %r: only raw_logprobs and "
                         "processed_logprobs hold log-probs" % logprobs_mode)
    mode = logprobs_mode.split("_")[0]
    out = []
    for ro in request_outputs:
        rid = getattr(ro, "request_id", None)
        ptoks = [int(t) for t in ro.prompt_token_ids]
        plp = getattr(ro, "prompt_logprobs", None)
        pvals = [None] * len(ptoks)
        if plp is not None:
            if len(plp) != len(ptoks):
                raise ValueError("request %s: %d prompt log-prob positions "
                                 "for %d prompt tokens" % (rid, len(plp),
                                                           len(ptoks)))
            for i in range(1, len(ptoks)):
                pvals[i] = _chosen(plp[i], ptoks[i], "request %s, prompt "
                                   "position %d" % (rid, i))
        base = dict(engine="vllm", model=model, dtype=dtype,
                    request_id=None if rid is None else str(rid), **meta)
        if score_prompt:
            if plp is None:
                raise ValueError("request %s: score_prompt needs "
                                 "prompt_logprobs (SamplingParams("
                                 "prompt_logprobs=0))" % rid)
            out.append(make_record(ptoks, pvals, 1, logprobs_mode="raw",
                                   logprobs_source="vllm prompt_logprobs",
                                   **base))
            continue
        for co in ro.outputs:
            ctoks = [int(t) for t in co.token_ids]
            if co.logprobs is None:
                raise ValueError("request %s, completion %s: no log-probs "
                                 "(SamplingParams(logprobs=0))"
                                 % (rid, co.index))
            if len(co.logprobs) != len(ctoks):
                raise ValueError("request %s, completion %s: %d log-prob "
                                 "positions for %d tokens" % (
                                     rid, co.index, len(co.logprobs),
                                     len(ctoks)))
            cvals = [_chosen(co.logprobs[j], ctoks[j], "request %s, "
                             "completion %s, token %d" % (rid, co.index, j))
                     for j in range(len(ctoks))]
            out.append(make_record(
                ptoks + ctoks, pvals + cvals, len(ptoks),
                completion_index=int(co.index), logprobs_mode=mode,
                logprobs_source="vllm sample logprobs" + (
                    " + prompt_logprobs" if plp is not None else ""),
                allow_missing=mode == "processed", **base))
    return out


# ---- TRL and verl rollout records -----------------------------------------

def _get(batch, key):
    if hasattr(batch, "batch") and not isinstance(batch, dict):
        batch = batch.batch          # verl DataProto -> its TensorDict
    try:
        v = batch[key]
    except (KeyError, TypeError):
        return None
    return None if v is None else _np(v)


def _need(batch, key, who):
    v = _get(batch, key)
    if v is None:
        raise KeyError("%s: the batch has no %r" % (who, key))
    return v


def _rows(prompt, pmask, resp, rmask, lmask, vals, source, meta):
    """Shared by TRL and verl: one record per row; prompt left-padded
    (pmask 1 = real), response right-padded (rmask 1 = real); lmask 0 = a
    real response token left out of the loss (tool output): null."""
    out = []
    for b in range(prompt.shape[0]):
        pt = prompt[b][pmask[b] != 0]
        n = int(np.count_nonzero(rmask[b]))
        if n and not np.all(rmask[b][:n] != 0):
            raise ValueError("row %d: the response mask is not a prefix "
                             "(right padding expected)" % b)
        rt = resp[b][:n]
        v = [None if lmask is not None and lmask[b][j] == 0 else
             float(vals[b][j]) for j in range(n)]
        out.append(make_record(np.concatenate([pt, rt]),
                               [None] * len(pt) + v, len(pt),
                               logprobs_source=source, allow_missing=True,
                               row=b, **meta))
    return out


TRL_FIELDS = ("old_per_token_logps", "sampling_per_token_logps",
              "ref_per_token_logps")


def from_trl(batch, field="sampling_per_token_logps", **meta):
    """Records from the dict that TRL's GRPOTrainer builds per generation
    batch (_generate_and_score_completions, trl/trainer/grpo_trainer.py):
    prompt_ids [B, P] and prompt_mask [B, P] (left-padded), completion_ids
    [B, C] and completion_mask [B, C] (right-padded), and per completion
    token: old_per_token_logps (the trainer's recomputation under the
    current weights, when it is needed), sampling_per_token_logps (vLLM's
    log-probs of the sampled tokens, use_vllm), ref_per_token_logps (the
    reference model). A tool_mask [B, C], where present, marks tool output
    (0): those positions are written null. Values: tensors or arrays."""
    if field not in TRL_FIELDS:
        raise ValueError("field must be one of %s" % (TRL_FIELDS,))
    who = "from_trl"
    vals = _need(batch, field, who)
    cm = _need(batch, "completion_mask", who)
    lmask = _get(batch, "tool_mask")
    return _rows(_need(batch, "prompt_ids", who),
                 _need(batch, "prompt_mask", who),
                 _need(batch, "completion_ids", who), cm, lmask, vals,
                 "trl " + field, dict(engine="trl", **meta))


VERL_FIELDS = ("old_log_probs", "rollout_log_probs", "ref_log_prob")


def from_verl(data, field="rollout_log_probs", **meta):
    """Records from a verl DataProto (its .batch TensorDict) or a dict of
    the same keys (verl/experimental/agent_loop/agent_loop.py,
    verl/trainer/ppo/ray_trainer.py): prompts [B, P] (left-padded),
    responses [B, R] (right-padded), attention_mask [B, P + R] (1 = real
    token), response_mask [B, R] (the loss mask: 0 on tool output and
    padding; compute_response_mask derives it from attention_mask when
    absent), and per response token old_log_probs (the actor's
    recomputation), rollout_log_probs (the rollout engine's, with
    rollout.calculate_log_probs) or ref_log_prob. Positions with
    response_mask 0 inside the response are written null."""
    if field not in VERL_FIELDS:
        raise ValueError("field must be one of %s" % (VERL_FIELDS,))
    who = "from_verl"
    vals = _need(data, field, who)
    prompt = _need(data, "prompts", who)
    resp = _need(data, "responses", who)
    am = _need(data, "attention_mask", who)
    P = prompt.shape[1]
    if am.shape[1] != P + resp.shape[1]:
        raise ValueError("%s: attention_mask has %d columns, prompts + "
                         "responses %d" % (who, am.shape[1],
                                           P + resp.shape[1]))
    return _rows(prompt, am[:, :P], resp, am[:, P:],
                 _get(data, "response_mask"), vals, "verl " + field,
                 dict(engine="verl", **meta))


# ---- xent audit ------------------------------------------------------------

def from_audit(audit, variant="fp32"):
    """Records from `xent audit --json` output (a path or the parsed dict):
    "tokens" [[...]] (B rows of S) and each variant's "chosen_logprobs"
    (B * (S - 1) values, row by row: entry b*(S-1)+s is log p of token
    s+1 of row b). One record per row, prompt_len = 1."""
    if isinstance(audit, str):
        with open(audit, encoding="utf-8") as f:
            audit = json.load(f)
    rows = audit["tokens"]
    vs = {v["name"]: v for v in audit["variants"]}
    if variant not in vs:
        raise KeyError("variant %r is not in the audit (it has %s)"
                       % (variant, ", ".join(vs)))
    v = vs[variant]
    lp = v["chosen_logprobs"]
    S = len(rows[0])
    if len(lp) != len(rows) * (S - 1):
        raise ValueError("%d chosen log-probs for %d rows of %d tokens"
                         % (len(lp), len(rows), S))
    st = audit.get("settings", {})
    pol = v.get("policy", {})
    out = []
    for b, row in enumerate(rows):
        out.append(make_record(
            row, [None] + lp[b * (S - 1):(b + 1) * (S - 1)], 1,
            engine="xent", engine_version=audit.get("version"),
            dtype=pol.get("compute"), variant=variant, policy=pol,
            model=st.get("model"), logprobs_mode="raw",
            logprobs_source="xent audit chosen_logprobs (ce=%s)"
            % pol.get("ce", "exact")))
    return out


# ---- command line ----------------------------------------------------------

def _tokenize(tok, path, max_tokens):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return ids[:max_tokens] if max_tokens else ids


def _split(ids, seq_len):
    """Rows of seq_len tokens, as `xent audit --seq-len` cuts a text (whole
    rows only; one shorter row when the text is shorter than seq_len)."""
    if not seq_len or len(ids) <= seq_len:
        return [ids]
    return [ids[i * seq_len:(i + 1) * seq_len]
            for i in range(len(ids) // seq_len)]


def _cmd_hf(a):
    sampling = None
    if (a.temperature, a.top_k, a.top_p, a.min_p) != (1.0, 0, 1.0, 0.0) \
            or a.logprobs == "processed":
        sampling = {"temperature": a.temperature, "top_k": a.top_k,
                    "top_p": a.top_p, "min_p": a.min_p}
    if a.threads:
        import torch
        torch.set_num_threads(a.threads)
    model, tok = load_hf(a.model, a.dtype, tokenizer=a.text is not None)
    if a.tokens:
        seqs, pls = read_token_sequences(a.tokens)
    else:
        seqs = _split(_tokenize(tok, a.text, a.max_tokens), a.seq_len)
        pls = [None] * len(seqs)
    if a.prompt_len is not None:
        pls = [a.prompt_len] * len(seqs)
    recs = hf_records(model, seqs, pls, dtype=a.dtype, logprobs=a.logprobs,
                      sampling=sampling, model_name=a.model)
    write_jsonl(recs, a.out)
    n = sum(len(r["tokens"]) for r in recs)
    print("xent.dump hf: %d sequence(s), %d tokens, %s, logprobs = %s -> %s"
          % (len(recs), n, a.dtype, recs[0]["logprobs_source"], a.out),
          file=sys.stderr)
    return 0


def _cmd_audit(a):
    recs = from_audit(a.audit, a.variant)
    write_jsonl(recs, a.out)
    print("xent.dump audit: variant %s, %d sequence(s) -> %s"
          % (a.variant, len(recs), a.out), file=sys.stderr)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m xent.dump",
        description="Write per-token log-prob dumps in the xent.dump/1 "
        "JSONL schema (docs/compare.md) for `xent compare`.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hf", help="Hugging Face transformers forward")
    h.add_argument("--model", required=True,
                   help="local model directory or .gguf file (offline)")
    src = h.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="text file, tokenized by the model's "
                     "tokenizer (no special tokens added)")
    src.add_argument("--tokens", help="token ids to score: a dump (JSONL, "
                     "its prompt_len kept), an `xent audit` JSON, or one "
                     "integer per line")
    h.add_argument("--dtype", default="fp32", choices=sorted(_TORCH_DTYPES),
                   help="weights and compute dtype (default fp32)")
    h.add_argument("--out", required=True, help="output .jsonl ('-' = stdout)")
    h.add_argument("--max-tokens", type=int, default=0,
                   help="--text: keep the first N tokens (0 = all)")
    h.add_argument("--seq-len", type=int, default=0,
                   help="--text: cut into rows of N tokens, as xent audit "
                   "--seq-len (0 = one sequence)")
    h.add_argument("--prompt-len", type=int, default=None,
                   help="prompt length of every sequence (default: the "
                   "--tokens dump's, else 1)")
    h.add_argument("--logprobs", default="xent",
                   choices=("xent", "engine", "processed"),
                   help="what \"logprobs\" holds: xent's exact log-softmax "
                   "of the engine's logits (default), the engine's own "
                   "log_softmax in its dtype, or the processed log-probs")
    h.add_argument("--temperature", type=float, default=1.0)
    h.add_argument("--top-k", type=int, default=0, help="0 = off")
    h.add_argument("--top-p", type=float, default=1.0)
    h.add_argument("--min-p", type=float, default=0.0)
    h.add_argument("--threads", type=int, default=0,
                   help="torch threads (0 = torch's default)")
    h.set_defaults(fn=_cmd_hf)
    u = sub.add_parser("audit", help="convert `xent audit --json` output")
    u.add_argument("audit", help="the audit JSON")
    u.add_argument("--variant", default="fp32")
    u.add_argument("--out", required=True)
    u.set_defaults(fn=_cmd_audit)
    a = ap.parse_args(argv)
    if a.cmd == "hf" and a.text is None and (a.max_tokens or a.seq_len):
        ap.error("--max-tokens and --seq-len apply to --text")
    try:
        return a.fn(a)
    except (ValueError, KeyError, OSError) as e:
        print("xent.dump %s: %s" % (a.cmd, e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
