"""xent.dump: the xent.dump/1 schema, its producers and adapters, and that
`xent compare` reads what they write.

The vLLM, TRL and verl inputs are recorded shapes, built here with the
attribute and key names of their sources:
  vLLM   vllm/outputs.py (RequestOutput: request_id, prompt_token_ids,
         prompt_logprobs, outputs; CompletionOutput: index, token_ids,
         logprobs), vllm/logprobs.py (Logprob: logprob, rank, decoded_token;
         PromptLogprobs = list[dict[int, Logprob] | None], FlatLogprobs a
         Sequence of the same dicts)
  TRL    trl/trainer/grpo_trainer.py, _generate_and_score_completions'
         output dict (prompt_ids, prompt_mask left-padded; completion_ids,
         completion_mask right-padded; old_per_token_logps,
         sampling_per_token_logps, ref_per_token_logps; tool_mask)
  verl   verl/experimental/agent_loop/agent_loop.py (batch TensorDict:
         prompts, responses, response_mask, input_ids, attention_mask,
         rollout_log_probs), verl/trainer/ppo/ray_trainer.py
         (old_log_probs, ref_log_prob)."""
import collections.abc
import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import xent
from xent import dump as xd

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _xent_cli():
    lib = os.environ.get("XENT_LIBRARY")
    for c in ([pathlib.Path(lib).parent / "xent"] if lib else []) + \
            [ROOT / "build" / "xent"]:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return None


def _compare(tmp_path, a, b, *extra):
    cli = _xent_cli()
    if cli is None:
        pytest.skip("the xent CLI is not built next to libxent.so")
    r = subprocess.run([cli, "compare", str(a), str(b), "--json", "-",
                        "--quiet", "--bootstrap", "0", *map(str, extra)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# ---------------------------------------------------------------- schema

def test_make_record_checks():
    r = xd.make_record([5, 6, 7], [None, -1.5, float("nan")], 3,
                       engine="x", dtype=None)
    assert r == {"schema": xd.SCHEMA, "tokens": [5, 6, 7],
                 "logprobs": [None, -1.5, None], "prompt_len": 3,
                 "engine": "x"}
    with pytest.raises(ValueError, match="3 entries but logprobs has 2"):
        xd.make_record([1, 2, 3], [None, -1], 1)
    with pytest.raises(ValueError, match="outside"):
        xd.make_record([1, 2], [None, -1], 3)
    with pytest.raises(ValueError, match=r"logprobs\[1\].*missing"):
        xd.make_record([1, 2], [None, None], 1)
    assert xd.make_record([1, 2], [None, None], 1,
                          allow_missing=True)["logprobs"] == [None, None]
    with pytest.raises(ValueError, match="schema key"):
        xd.make_record([1, 2], [None, -1], 1, schema="x")


def test_compare_reads_the_schema(tmp_path):
    """Metadata objects, -Infinity and null in the prompt are accepted;
    prompt_len masks the prompt; tokens are checked across files."""
    recs_a = [xd.make_record([1, 2, 3, 4], [None, -9.0, -0.5, -0.25], 2,
                             engine="a", sampling={"top_p": 0.9},
                             processed_logprobs=[None, -math.inf, -0.1, 0.0]),
              xd.make_record([7, 8, 9], [None, -1.0, -2.0], 1, engine="a",
                             sampling={"top_p": 0.9},
                             processed_logprobs=[None, -1, -2])]
    recs_b = [xd.make_record([1, 2, 3, 4], [None, None, -0.75, -0.25], 2,
                             engine="b"),
              xd.make_record([7, 8, 9], [None, -1.5, -2.0], 1, engine="b")]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    xd.write_jsonl(recs_a, a)
    xd.write_jsonl(recs_b, b)
    assert xd.read_jsonl(a) == json.loads(json.dumps(recs_a))
    assert "-Infinity" in a.read_text()
    d = _compare(tmp_path, a, b)
    assert d["tokens"] == 7 and d["selected"] == 4 and d["used"] == 4
    assert d["delta"]["mean"] == pytest.approx((0.25 + 0 + 0.5 + 0) / 4)
    recs_b[1]["tokens"][2] = 10
    xd.write_jsonl(recs_b, b)
    cli = _xent_cli()
    r = subprocess.run([cli, "compare", str(a), str(b), "--quiet"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "9" in r.stdout + r.stderr


def test_read_token_sequences(tmp_path):
    p = tmp_path / "d.jsonl"
    xd.write_jsonl([xd.make_record([1, 2, 3], [None, -1, -1], 2)], p)
    assert xd.read_token_sequences(p) == ([[1, 2, 3]], [2])
    p = tmp_path / "audit.json"
    p.write_text(json.dumps({"tool": "xent audit", "tokens": [[1, 2], [3, 4]]}))
    assert xd.read_token_sequences(p) == ([[1, 2], [3, 4]], [None, None])
    p = tmp_path / "ids.txt"
    p.write_text("4\n5\n6\n")
    assert xd.read_token_sequences(p) == ([[4, 5, 6]], [None])


# ---------------------------------------------------------------- vLLM

@dataclasses.dataclass
class Logprob:                       # vllm/logprobs.py
    logprob: float
    rank: int = None
    decoded_token: str = None


@dataclasses.dataclass
class CompletionOutput:              # vllm/outputs.py
    index: int
    text: str
    token_ids: list
    cumulative_logprob: float
    logprobs: list
    finish_reason: str = None


class RequestOutput:                 # vllm/outputs.py (the attributes read)
    def __init__(self, request_id, prompt, prompt_token_ids, prompt_logprobs,
                 outputs, finished=True):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished


class FlatLogprobs(collections.abc.Sequence):
    """vLLM's flat storage: a Sequence whose items are {token_id: Logprob}."""

    def __init__(self, positions):
        self.start, self.end, self.ids, self.lps = [], [], [], []
        for pos in positions:
            self.start.append(len(self.ids))
            for t, e in (pos or {}).items():
                self.ids.append(t)
                self.lps.append(e.logprob)
            self.end.append(len(self.ids))

    def __len__(self):
        return len(self.start)

    def __getitem__(self, i):
        return {self.ids[j]: Logprob(self.lps[j], j - self.start[i] + 1)
                for j in range(self.start[i], self.end[i])}


def _pos(chosen, lp, others=((99, -0.01),)):
    d = {t: Logprob(v, k + 1) for k, (t, v) in enumerate(others)}
    d[chosen] = Logprob(lp, 7)
    return d


def _vllm_outputs(flat=False):
    prompt = [11, 12, 13]
    plp = [None, _pos(12, -3.0), _pos(13, -2.5)]
    c0 = CompletionOutput(0, "", [21, 22], -1.0,
                          [_pos(21, -0.5), _pos(22, -0.25)])
    c1 = CompletionOutput(1, "", [31], -0.1, [_pos(31, -0.125)])
    if flat:
        plp = FlatLogprobs(plp)
        c0.logprobs = FlatLogprobs(c0.logprobs)
    return [RequestOutput("r0", None, prompt, plp, [c0, c1]),
            RequestOutput("r1", None, [5, 6], None,
                          [CompletionOutput(0, "", [7], 0, [_pos(7, -1.0)])])]


@pytest.mark.parametrize("flat", [False, True])
def test_from_vllm(flat, tmp_path):
    recs = xd.from_vllm(_vllm_outputs(flat), model="m", dtype="bf16")
    assert [r["tokens"] for r in recs] == [[11, 12, 13, 21, 22],
                                           [11, 12, 13, 31], [5, 6, 7]]
    assert recs[0]["logprobs"] == [None, -3.0, -2.5, -0.5, -0.25]
    assert recs[1]["logprobs"] == [None, -3.0, -2.5, -0.125]
    assert recs[2]["logprobs"] == [None, None, -1.0]
    assert [r["prompt_len"] for r in recs] == [3, 3, 2]
    assert recs[0]["logprobs_mode"] == "raw"
    assert recs[1]["completion_index"] == 1 and recs[0]["request_id"] == "r0"
    p = tmp_path / "v.jsonl"
    xd.write_jsonl(recs, p)
    d = _compare(tmp_path, p, p)
    assert d["used"] == 4 and d["delta"]["rms"] == 0
    # teacher forcing: the prompt alone
    s = xd.from_vllm(_vllm_outputs(flat)[:1], score_prompt=True)
    assert s[0]["tokens"] == [11, 12, 13] and s[0]["prompt_len"] == 1
    assert s[0]["logprobs"] == [None, -3.0, -2.5]


def test_from_vllm_processed_and_errors():
    outs = _vllm_outputs()
    outs[0].outputs[0].logprobs[1] = _pos(22, -math.inf)
    recs = xd.from_vllm(outs, logprobs_mode="processed_logprobs")
    assert recs[0]["logprobs"][-1] == -math.inf
    assert recs[0]["logprobs_mode"] == "processed"
    with pytest.raises(ValueError, match="hold log-probs"):
        xd.from_vllm(outs, logprobs_mode="raw_logits")
    outs[0].outputs[0].logprobs[0] = {99: Logprob(-0.1, 1)}
    with pytest.raises(ValueError, match="token 21 is not among"):
        xd.from_vllm(outs)
    outs = _vllm_outputs()
    with pytest.raises(ValueError, match="score_prompt needs prompt_logprobs"):
        xd.from_vllm(outs[1:], score_prompt=True)
    outs[0].outputs[1].logprobs = None
    with pytest.raises(ValueError, match=r"logprobs=0"):
        xd.from_vllm(outs)


# ---------------------------------------------------------------- TRL, verl

def _padded_batch(lib):
    """Two rows: prompts [3, 1] tokens left-padded to 3 (pad 0), responses
    [2, 4] tokens right-padded to 4; per-token log-probs with pad values."""
    arr = (lambda x, dt: lib.tensor(x, dtype=dt)) if lib is not None else \
        (lambda x, dt: np.array(x, dtype=dt))
    i64 = lib.long if lib is not None else np.int64
    f32 = lib.float32 if lib is not None else np.float32
    prompt = arr([[1, 2, 3], [0, 0, 4]], i64)
    pmask = arr([[1, 1, 1], [0, 0, 1]], i64)
    resp = arr([[5, 6, 0, 0], [7, 8, 9, 10]], i64)
    rmask = arr([[1, 1, 0, 0], [1, 1, 1, 1]], i64)
    lp = arr([[-0.5, -0.25, 0, 0], [-1, -2, -3, -4]], f32)
    return prompt, pmask, resp, rmask, lp


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_from_trl(lib, tmp_path):
    t = pytest.importorskip("torch") if lib == "torch" else None
    prompt, pmask, comp, cmask, lp = _padded_batch(t)
    batch = {"prompt_ids": prompt, "prompt_mask": pmask,
             "completion_ids": comp, "completion_mask": cmask,
             "old_per_token_logps": lp * 1.0, "sampling_per_token_logps": lp,
             "advantages": prompt[:, 0] * 0.0, "num_items_in_batch": 6}
    recs = xd.from_trl(batch, "sampling_per_token_logps", step=3)
    assert [r["tokens"] for r in recs] == [[1, 2, 3, 5, 6], [4, 7, 8, 9, 10]]
    assert [r["prompt_len"] for r in recs] == [3, 1]
    assert recs[0]["logprobs"] == [None, None, None, -0.5, -0.25]
    assert recs[1]["logprobs"] == [None, -1, -2, -3, -4]
    assert recs[0]["logprobs_source"] == "trl sampling_per_token_logps"
    assert recs[0]["step"] == 3 and recs[1]["row"] == 1
    # tool output (tool_mask 0) is written null
    tm = np.array([[1, 1, 1, 1], [1, 0, 1, 1]])
    batch["tool_mask"] = t.tensor(tm) if t is not None else tm
    recs2 = xd.from_trl(batch, "old_per_token_logps")
    assert recs2[1]["logprobs"] == [None, -1, None, -3, -4]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    xd.write_jsonl(recs, a)
    xd.write_jsonl(xd.from_trl(batch, "old_per_token_logps"), b)
    with pytest.raises(ValueError, match="one of"):
        xd.from_trl(batch, "logprobs")
    del batch["completion_mask"]
    with pytest.raises(KeyError, match="completion_mask"):
        xd.from_trl(batch)


class DataProto:
    """verl.protocol.DataProto's shape: .batch (a TensorDict: indexable by
    key), .non_tensor_batch, .meta_info."""

    def __init__(self, batch):
        self.batch = batch
        self.non_tensor_batch = {}
        self.meta_info = {}


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_from_verl(lib, tmp_path):
    t = pytest.importorskip("torch") if lib == "torch" else None
    prompt, pmask, resp, rmask, lp = _padded_batch(t)
    cat = (lambda a, b: t.cat([a, b], 1)) if t is not None else \
        (lambda a, b: np.concatenate([a, b], 1))
    am = cat(pmask, rmask)
    loss_mask = rmask * 1
    loss_mask[1, 2] = 0                       # a tool-output token
    data = DataProto({"prompts": prompt, "responses": resp,
                      "input_ids": cat(prompt, resp), "attention_mask": am,
                      "response_mask": loss_mask, "old_log_probs": lp - 0.5,
                      "rollout_log_probs": lp})
    recs = xd.from_verl(data, "rollout_log_probs")
    assert [r["tokens"] for r in recs] == [[1, 2, 3, 5, 6], [4, 7, 8, 9, 10]]
    assert [r["prompt_len"] for r in recs] == [3, 1]
    assert recs[0]["logprobs"] == [None, None, None, -0.5, -0.25]
    assert recs[1]["logprobs"] == [None, -1, -2, None, -4]
    old = xd.from_verl(data.batch, "old_log_probs")       # a plain dict too
    assert old[0]["logprobs"][3:] == [-1.0, -0.75]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    xd.write_jsonl(old, a)
    xd.write_jsonl(recs, b)
    cli = _xent_cli()
    if cli is None:
        pytest.skip("the xent CLI is not built next to libxent.so")
    r = subprocess.run([cli, "compare", str(a), str(b), "--json", "-",
                        "--quiet", "--bootstrap", "0", "--exclude-bad"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["used"] == 5 and d["excluded"] == 1
    assert d["delta"]["mean"] == pytest.approx(-0.5)


# ---------------------------------------------------------------- xent audit

def test_from_audit(tmp_path):
    audit = {"tool": "xent audit", "version": "0.1.0",
             "settings": {"model": "m.gguf"}, "tokens": [[1, 2, 3], [4, 5, 6]],
             "variants": [
                 {"name": "fp32", "reference": True,
                  "policy": {"compute": "fp32", "ce": "exact"},
                  "chosen_logprobs": [-1, -2, -3, -4]},
                 {"name": "bf16", "reference": False,
                  "policy": {"compute": "bf16", "ce": "exact"},
                  "chosen_logprobs": [-1.5, -2, -3, None]}]}
    p = tmp_path / "audit.json"
    p.write_text(json.dumps(audit))
    r = xd.from_audit(str(p), "fp32")
    assert [x["tokens"] for x in r] == [[1, 2, 3], [4, 5, 6]]
    assert [x["logprobs"] for x in r] == [[None, -1, -2], [None, -3, -4]]
    assert r[0]["dtype"] == "fp32" and r[0]["engine"] == "xent"
    with pytest.raises(ValueError, match="missing"):
        xd.from_audit(audit, "bf16")
    with pytest.raises(KeyError, match="fp16"):
        xd.from_audit(audit, "fp16")
    out = tmp_path / "x.jsonl"
    assert xd.main(["audit", str(p), "--variant", "fp32", "--out",
                    str(out)]) == 0
    assert xd.read_jsonl(out) == json.loads(json.dumps(r))


# ---------------------------------------------------------------- transformers

@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    """A tiny random Llama made offline from transformers' config class."""
    torch = pytest.importorskip("torch")
    tr = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tr.LlamaConfig(vocab_size=300, hidden_size=64,
                         intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=True)
    m = tr.LlamaForCausalLM(cfg)
    with torch.no_grad():          # larger logits than the init's, so that
        m.lm_head.weight.mul_(40)  # bf16 rounding of them matters
    d = tmp_path_factory.mktemp("tiny_llama")
    m.save_pretrained(d)
    return str(d)


def test_hf_records(tiny_hf):
    import torch
    m, _ = xd.load_hf(tiny_hf, "fp32", tokenizer=False)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 300, 40).tolist(), rng.integers(0, 300, 9).tolist()]
    samp = {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.0}
    for dt, tdt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        mm = m.to(tdt)
        recs = xd.hf_records(mm, seqs, [3, None], dtype=dt, sampling=samp,
                             model_name="tiny")
        assert [r["prompt_len"] for r in recs] == [3, 1]
        for r, s in zip(recs, seqs):
            assert r["tokens"] == s and r["dtype"] == dt
            ids = torch.tensor(s)
            with torch.no_grad():
                z = mm(input_ids=ids[None]).logits[0, :-1]
            assert z.dtype == tdt
            ref = torch.log_softmax(z.double(), -1).gather(
                -1, ids[1:, None])[:, 0].numpy()
            got = np.array(r["logprobs"][1:])
            # xent's exact log-softmax of the engine's logits: 1 ulp (f32)
            assert np.all(np.abs(got - ref) <= np.spacing(
                np.abs(ref).astype(np.float32)) + 1e-30)
            eng = torch.log_softmax(z, -1).gather(-1, ids[1:, None])[:, 0]
            assert r["engine_logprobs"][1:] == eng.float().tolist()
            proc = xent.sampler_logprobs(z, ids[1:], **samp).logprob
            assert r["processed_logprobs"][1:] == proc.tolist()
            assert r["sampling"] == samp
        if dt == "bf16":
            # bf16 log_softmax in bf16 is the engine's arithmetic: it differs
            assert any(abs(a - b) > 1e-3 for a, b in zip(
                recs[0]["logprobs"][1:], recs[0]["engine_logprobs"][1:]))
    f64 = xd.hf_records(m.to(torch.float64), seqs[:1], dtype="fp64")
    assert "float64" in f64[0]["logprobs_source"]


def test_hf_cli(tiny_hf, tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("\n".join(map(str, range(5, 45))) + "\n")
    outs = {}
    for dt in ("fp32", "bf16"):
        outs[dt] = tmp_path / ("%s.jsonl" % dt)
        assert xd.main(["hf", "--model", tiny_hf, "--tokens", str(ids),
                        "--dtype", dt, "--out", str(outs[dt]),
                        "--prompt-len", "4"]) == 0
    r = xd.read_jsonl(outs["bf16"])[0]
    assert r["prompt_len"] == 4 and r["logits_dtype"] == "bfloat16"
    assert r["logprobs_source"] == "xent exact log-softmax"
    p = tmp_path / "p.jsonl"
    assert xd.main(["hf", "--model", tiny_hf, "--tokens", str(ids), "--out",
                    str(p), "--logprobs", "processed", "--top-k", "5"]) == 0
    r = xd.read_jsonl(p)[0]
    assert r["logprobs_mode"] == "processed"
    assert r["sampling"]["top_k"] == 5
    d = _compare(tmp_path, outs["bf16"], outs["fp32"])
    assert d["used"] == 40 - 4 and d["delta"]["rms"] > 0
    # the module runs as `python -m xent.dump`
    q = subprocess.run([sys.executable, "-m", "xent.dump", "hf", "--model",
                        tiny_hf, "--tokens", str(ids), "--out", "-"],
                       capture_output=True, text=True,
                       cwd=str(ROOT / "python"))
    assert q.returncode == 0, q.stderr
    assert json.loads(q.stdout)["tokens"] == list(range(5, 45))
    q = subprocess.run([sys.executable, "-m", "xent.dump", "hf", "--model",
                        tiny_hf, "--tokens", str(ids), "--out", "-",
                        "--max-tokens", "3"], capture_output=True, text=True,
                       cwd=str(ROOT / "python"))
    assert q.returncode == 2 and "--max-tokens" in q.stderr


# ------------------------------------------------- GGUF tokenizer via transformers

def test_gguf_tokenizer_matches_xent():
    """load_hf on the default model's GGUF tokenizes like `xent model
    tokenize` (SmolLM2's digit split restored over transformers' byte-level
    only GGUF tokenizer), where whitespace runs meet digits."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    gguf = pathlib.Path(os.environ.get("XENT_CACHE", pathlib.Path.home() / ".cache" / "xent")) \
        / "SmolLM2-135M-Instruct.Q4_1.gguf"
    cli = _xent_cli()
    if not gguf.is_file() or cli is None:
        pytest.skip("the default model (make model) or the xent CLI is absent")
    _, tok = xd.load_hf(str(gguf))
    for text in ("\n\n  0.", "abc 123456 x", "  hi\n\n\n  there 42", "x  \n 7 8\t\t9"):
        r = subprocess.run([cli, "model", "tokenize", str(gguf), "--text", text],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        want = [int(v) for v in r.stdout.split()]
        assert tok.encode(text, add_special_tokens=False) == want, text


def test_write_jsonl_is_atomic(tmp_path):
    """A dump that fails midway leaves the earlier file as it was and no
    temporary file behind."""
    out = tmp_path / "a.jsonl"
    xd.write_jsonl([{"token_ids": [1, 2]}], str(out))
    before = out.read_bytes()

    def records():
        yield {"token_ids": [3]}
        raise RuntimeError("engine failed")
    with pytest.raises(RuntimeError):
        xd.write_jsonl(records(), str(out))
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]
