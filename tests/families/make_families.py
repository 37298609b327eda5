#!/usr/bin/env python3
"""tests/families/make_families.py OUT: tiny random Hugging Face checkpoints,
one per architecture family (llama, qwen2, qwen3, mistral, gemma2,
gemma3_text), each with its float64 reference computed here in numpy.

For each family OUT/<family>/ gets
  config.json, model-0000k-of-0000n.safetensors (3 shards, F32) and
  model.safetensors.index.json (weight_map), tokenizer.json (a byte-level BPE
  with merges and added tokens; gemma2's is SentencePiece-style with the 256
  byte tokens and byte_fallback),
  ref.json: B, S, tokens, the float64 loss and logits, finite-difference
  gradients of a few parameters, and the token ids of a text under the
  tokenizer (encoded here by a separate BPE).

The reference is written from the Hugging Face modeling code of each family
(transformers/models/<family>/modeling_<family>.py), independently of the C
code: RMSNorm (Gemma: x * r * (1 + w)), RoPE rotate_half with HF's float32
inverse frequencies and angles, GQA, causal mask with the sliding window
(key j seen by query i when i - j < window), Gemma's sqrt(hidden) embedding
scale, query_pre_attn_scalar, attention and final logit soft-capping, GeGLU
with the tanh gelu, pre- and post-norms, q/k norms over head_dim, and
Gemma 3's local RoPE base on sliding layers. numpy only."""
import json
import os
import struct
import sys

import numpy as np

# ---- the families' tiny configurations -------------------------------------

BASE = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            vocab_size=300, max_position_embeddings=64, rms_norm_eps=1e-6,
            rope_theta=10000.0, initializer_range=0.02)

FAMILIES = {
    "llama": dict(model_type="llama", architectures=["LlamaForCausalLM"],
                  tie_word_embeddings=False, hidden_act="silu", _pre="gpt2"),
    "qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                  tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
                  sliding_window=4096, _pre="qwen2"),
    "qwen3": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                  tie_word_embeddings=False, hidden_act="silu", attention_bias=False,
                  use_sliding_window=False, head_dim=16, _pre="qwen2"),
    "mistral": dict(model_type="mistral", architectures=["MistralForCausalLM"],
                    tie_word_embeddings=False, hidden_act="silu", sliding_window=3,
                    _pre="llama-bpe"),
    "gemma2": dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"],
                   tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
                   query_pre_attn_scalar=12, attn_logit_softcapping=1.5,
                   final_logit_softcapping=2.5, sliding_window=3, _pre="spm"),
    "gemma3_text": dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"],
                        tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
                        query_pre_attn_scalar=8, sliding_window=3, sliding_window_pattern=2,
                        num_hidden_layers=4, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                        rope_scaling={"rope_type": "linear", "factor": 2.0},
                        attn_logit_softcapping=None, final_logit_softcapping=None,
                        _pre="smollm"),
}

B, S = 2, 8


def cfg_of(name):
    c = dict(BASE)
    c.update(FAMILIES[name])
    return c


def layer_names(c):
    t = c["model_type"]
    gemma = t.startswith("gemma")
    qk = t in ("qwen3", "gemma3_text")
    bias = t == "qwen2"
    D, H = c["hidden_size"], c["intermediate_size"]
    hd, nh, nkv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    shapes = {
        "input_layernorm.weight": (D,),
        "self_attn.q_proj.weight": (nh * hd, D),
        "self_attn.k_proj.weight": (nkv * hd, D),
        "self_attn.v_proj.weight": (nkv * hd, D),
        "self_attn.o_proj.weight": (D, nh * hd),
        "post_attention_layernorm.weight": (D,),
        "mlp.gate_proj.weight": (H, D),
        "mlp.up_proj.weight": (H, D),
        "mlp.down_proj.weight": (D, H),
    }
    if bias:
        shapes.update({"self_attn.q_proj.bias": (nh * hd,), "self_attn.k_proj.bias": (nkv * hd,),
                       "self_attn.v_proj.bias": (nkv * hd,)})
    if qk:
        shapes.update({"self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,)})
    if gemma:
        shapes.update({"pre_feedforward_layernorm.weight": (D,),
                       "post_feedforward_layernorm.weight": (D,)})
    return shapes


def make_params(c, rng):
    gemma = c["model_type"].startswith("gemma")
    P = {}
    V, D = c["vocab_size"], c["hidden_size"]
    P["model.embed_tokens.weight"] = rng.normal(0, 0.5, (V, D))
    for l in range(c["num_hidden_layers"]):
        for k, shp in layer_names(c).items():
            if k.endswith("norm.weight"):
                # around 1 (Llama) or around 0 (Gemma's 1 + w): random, so
                # that every norm's weight matters
                v = rng.normal(0, 0.3, shp) + (0.0 if gemma else 1.0)
            elif k.endswith("bias"):
                v = rng.normal(0, 0.3, shp)
            else:
                v = rng.normal(0, 0.35, shp)
            P["model.layers.%d.%s" % (l, k)] = v
    P["model.norm.weight"] = rng.normal(0, 0.3, (D,)) + (0.0 if gemma else 1.0)
    if not c["tie_word_embeddings"]:
        P["lm_head.weight"] = rng.normal(0, 0.5, (V, D))
    # the values stored are float32: the reference uses exactly those
    return {k: v.astype(np.float32).astype(np.float64) for k, v in P.items()}


# ---- float64 reference -----------------------------------------------------

def rmsnorm(x, w, eps, gemma):
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * r * ((1.0 + w) if gemma else w)


def rope_tables(c, local):
    """HF: inv_freq = 1 / base ** (arange(0, hd, 2) / hd) in float32, the
    angle pos * inv_freq in float32, its cos/sin (here rounded to float32
    from float64)."""
    hd = c["head_dim"]
    base = c.get("rope_local_base_freq") if local else c["rope_theta"]
    e = np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)
    inv = (np.float32(1.0) / np.power(np.float32(base), e)).astype(np.float32)
    rs = c.get("rope_scaling")
    if rs and not local and rs.get("rope_type") == "linear":
        inv = (inv / np.float32(rs["factor"])).astype(np.float32)
    ang = (np.arange(S, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float32)
    cos = np.cos(ang.astype(np.float64)).astype(np.float32).astype(np.float64)
    sin = np.sin(ang.astype(np.float64)).astype(np.float32).astype(np.float64)
    return np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)


def apply_rope(x, cos, sin):  # x [S, n, hd]
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def layer_sliding(c, l):
    t = c["model_type"]
    w = c.get("sliding_window")
    if t == "mistral":
        return w is not None
    if t == "gemma2":
        return (l + 1) % 2 != 0
    if t == "gemma3_text":
        return (l + 1) % c.get("sliding_window_pattern", 6) != 0
    return False


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + np.exp(-x))


def forward(c, P, tokens):
    """logits [B*S, V] and the mean next-token loss."""
    t = c["model_type"]
    gemma = t.startswith("gemma")
    qk = t in ("qwen3", "gemma3_text")
    D, hd = c["hidden_size"], c["head_dim"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    eps = c["rms_norm_eps"]
    qs = c.get("query_pre_attn_scalar") or hd
    acap = c.get("attn_logit_softcapping") if t == "gemma2" else None
    fcap = c.get("final_logit_softcapping") if t == "gemma2" else None
    tabs = {False: rope_tables(c, False)}
    if t == "gemma3_text":
        tabs[True] = rope_tables(c, True)
    all_logits = []
    for b in range(tokens.shape[0]):
        h = P["model.embed_tokens.weight"][tokens[b]]
        if gemma:
            h = h * np.sqrt(D)
        for l in range(c["num_hidden_layers"]):
            g = lambda k: P["model.layers.%d.%s" % (l, k)]
            x = h
            xn = rmsnorm(x, g("input_layernorm.weight"), eps, gemma)
            q = xn @ g("self_attn.q_proj.weight").T
            k = xn @ g("self_attn.k_proj.weight").T
            v = xn @ g("self_attn.v_proj.weight").T
            if t == "qwen2":
                q = q + g("self_attn.q_proj.bias")
                k = k + g("self_attn.k_proj.bias")
                v = v + g("self_attn.v_proj.bias")
            q = q.reshape(S, nh, hd)
            k = k.reshape(S, nkv, hd)
            v = v.reshape(S, nkv, hd)
            if qk:
                q = rmsnorm(q, g("self_attn.q_norm.weight"), eps, gemma)
                k = rmsnorm(k, g("self_attn.k_norm.weight"), eps, gemma)
            sl = layer_sliding(c, l)
            cos, sin = tabs[sl and t == "gemma3_text"]
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
            o = np.zeros((S, nh, hd))
            i_ = np.arange(S)[:, None]
            j_ = np.arange(S)[None, :]
            mask = j_ <= i_
            if sl:
                mask &= (i_ - j_) < c["sliding_window"]
            for hh in range(nh):
                kv = hh // (nh // nkv)
                sc = (q[:, hh, :] @ k[:, kv, :].T) / np.sqrt(qs)
                if acap:
                    sc = acap * np.tanh(sc / acap)
                sc = np.where(mask, sc, -np.inf)
                sc = sc - sc.max(-1, keepdims=True)
                p = np.exp(sc)
                p /= p.sum(-1, keepdims=True)
                o[:, hh, :] = p @ v[:, kv, :]
            a = o.reshape(S, nh * hd) @ g("self_attn.o_proj.weight").T
            if gemma:
                a = rmsnorm(a, g("post_attention_layernorm.weight"), eps, True)
                h = x + a
                xn2 = rmsnorm(h, g("pre_feedforward_layernorm.weight"), eps, True)
            else:
                h = x + a
                xn2 = rmsnorm(h, g("post_attention_layernorm.weight"), eps, False)
            gt = xn2 @ g("mlp.gate_proj.weight").T
            up = xn2 @ g("mlp.up_proj.weight").T
            act = (gelu_tanh(gt) if gemma else silu(gt)) * up
            m = act @ g("mlp.down_proj.weight").T
            if gemma:
                m = rmsnorm(m, g("post_feedforward_layernorm.weight"), eps, True)
            h = h + m
        hf = rmsnorm(h, P["model.norm.weight"], eps, gemma)
        W = P["model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"]
        z = hf @ W.T
        if fcap:
            z = fcap * np.tanh(z / fcap)
        all_logits.append(z)
    z = np.concatenate(all_logits, 0)
    # next-token targets, the last position of each row ignored
    tot, n = 0.0, 0
    for b in range(tokens.shape[0]):
        for s in range(S - 1):
            row = z[b * S + s]
            mx = row.max()
            lse = mx + np.log(np.exp(row - mx).sum())
            tot += lse - row[tokens[b, s + 1]]
            n += 1
    return z, tot / n


# ---- safetensors, shards, index --------------------------------------------

def write_safetensors(path, tensors):
    header, off, blobs = {}, 0, []
    for name, arr in tensors:
        a = np.ascontiguousarray(arr, dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        blobs.append(a.tobytes())
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for bl in blobs:
            f.write(bl)


def write_sharded(d, P, nshards=3):
    names = list(P)
    parts = [names[i::nshards] for i in range(nshards)]
    wm = {}
    total = 0
    for k, part in enumerate(parts):
        fn = "model-%05d-of-%05d.safetensors" % (k + 1, nshards)
        write_safetensors(os.path.join(d, fn), [(n, P[n]) for n in part])
        for n in part:
            wm[n] = fn
            total += P[n].size * 4
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)


# ---- tokenizer.json and a separate BPE encoder -----------------------------

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(x) for x in cs]))


B2U = bytes_to_unicode()
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"), ("Ġw", "o"),
          ("r", "l"), ("Ġwo", "rl"), ("Ġworl", "d"), ("1", "2"), ("12", "3"), ("Ġ", "h")]
ADDED = [("<|endoftext|>", True), ("<tool>", False)]

LLAMA3_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
             "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2_RE = LLAMA3_RE.replace("\\p{N}{1,3}", "\\p{N}")


def tokenizer_json(pre):
    vocab = {}
    for b in range(256):
        vocab[B2U[b]] = len(vocab)
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    added = []
    for s, special in ADDED:
        added.append({"id": len(vocab) + len(added), "content": s, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False, "special": special})
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if pre == "gpt2":
        pt = bl
    elif pre == "smollm":
        pt = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, bl]}
    else:
        pat = LLAMA3_RE if pre == "llama-bpe" else QWEN2_RE
        pt = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pat}, "behavior": "Isolated", "invert": False},
            dict(bl, use_regex=False)]}
    merges = [a + " " + b for a, b in MERGES]
    if pre == "qwen2":  # newer files store pairs
        merges = [[a, b] for a, b in MERGES]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "NFC"} if pre == "qwen2" else None, "pre_tokenizer": pt,
            "post_processor": None, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False,
                      "vocab": vocab, "merges": merges}}


SPM_CHARS = "▁helowrd123é"
SPM_MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("▁", "w"), ("▁w", "o"),
              ("r", "l"), ("▁wo", "rl"), ("▁worl", "d"), ("1", "2"), ("12", "3"), ("▁", "h"),
              ("▁", "▁"), ("é", "▁")]
SPM_ADDED = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>"]


def spm_tokenizer_json():
    """Gemma-style: SentencePiece BPE with byte_fallback (not byte-level):
    the specials, the 256 byte tokens <0xXX>, characters and merges."""
    vocab = {s: i for i, s in enumerate(SPM_ADDED)}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for ch in SPM_CHARS:
        vocab[ch] = len(vocab)
    for a, b in SPM_MERGES:
        vocab[a + b] = len(vocab)
    added = [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True} for s in SPM_ADDED]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            "pre_tokenizer": None, "post_processor": None,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                      "ignore_merges": False, "vocab": vocab,
                      "merges": [a + " " + b for a, b in SPM_MERGES]}}


def spm_encode(text, vocab):
    """The SentencePiece-style BPE, written apart from the C one: split out
    the added tokens, spaces to U+2581, merge the lowest-ranked adjacent pair
    (leftmost among equals) over the characters, unknown symbols as their
    UTF-8 bytes' <0xXX> tokens."""
    ranks = {(a, b): i for i, (a, b) in enumerate(SPM_MERGES)}
    ids = []
    i = 0
    while i < len(text):
        hit = next((s for s in sorted(SPM_ADDED, key=len, reverse=True) if text.startswith(s, i)), None)
        if hit:
            ids.append(vocab[hit])
            i += len(hit)
            continue
        j = i + 1
        while j < len(text) and not any(text.startswith(s, j) for s in SPM_ADDED):
            j += 1
        sym = list(text[i:j].replace(" ", "▁"))
        while True:
            best = min(((ranks[(sym[k], sym[k + 1])], k) for k in range(len(sym) - 1)
                        if (sym[k], sym[k + 1]) in ranks), default=None)
            if best is None:
                break
            k = best[1]
            sym[k:k + 2] = [sym[k] + sym[k + 1]]
        for s in sym:
            ids += [vocab[s]] if s in vocab else [vocab["<0x%02X>" % b] for b in s.encode()]
        i = j
    return ids


def spm_check_with_tokenizers(tj, text, ids):
    """Where Hugging Face tokenizers is installed, its ids for the file must
    equal spm_encode's (the reference the C test holds the C tokenizer to)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return
    got = Tokenizer.from_str(json.dumps(tj)).encode(text, add_special_tokens=False).ids
    if got != ids:
        raise SystemExit("spm reference disagrees with tokenizers: %s vs %s" % (ids, got))


def pre_split(text, pre):
    """The pre-tokenizers on text of ASCII letters, digits and spaces."""
    import re
    L, N = "A-Za-z", "0-9"
    if pre == "smollm":
        out = []
        for piece in re.findall(r"[0-9]|[^0-9]+", text):
            out += pre_split(piece, "gpt2") if not piece.isdigit() else [piece]
        return out
    if pre == "gpt2":
        pat = r" ?[%s]+| ?[%s]+| ?[^\s%s%s]+|\s+(?!\S)|\s+" % (L, N, L, N)
    else:
        dig = "[%s]{1,3}" % N if pre == "llama-bpe" else "[%s]" % N
        pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n%s%s]?[%s]+|%s| ?[^\s%s%s]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+") % (L, N, L, dig, L, N)
    return re.findall(pat, text)


def bpe_encode(text, pre, vocab):
    ranks = {a + " " + b: i for i, (a, b) in enumerate(MERGES)}
    ids = []
    specials = [s for s, _ in ADDED]
    i = 0
    pieces = []
    while i < len(text):  # split out the added tokens (longest first)
        hit = None
        for s in sorted(specials, key=len, reverse=True):
            if text.startswith(s, i):
                hit = s
                break
        if hit:
            pieces.append((True, hit))
            i += len(hit)
        else:
            j = i + 1
            while j < len(text) and not any(text.startswith(s, j) for s in specials):
                j += 1
            pieces.append((False, text[i:j]))
            i = j
    for special, piece in pieces:
        if special:
            ids.append(vocab[piece])
            continue
        for chunk in pre_split(piece, pre):
            sym = [B2U[b] for b in chunk.encode()]
            while len(sym) > 1:
                best = None
                for k in range(len(sym) - 1):
                    r = ranks.get(sym[k] + " " + sym[k + 1])
                    if r is not None and (best is None or r < best[0]):
                        best = (r, k)
                if best is None:
                    break
                k = best[1]
                sym = sym[:k] + [sym[k] + sym[k + 1]] + sym[k + 2:]
            ids += [vocab[s] for s in sym]
    return ids


# ---- main ------------------------------------------------------------------

def fd_entries(c, P, rng):
    """A few (name, flat index) pairs of every kind the family has."""
    t = c["model_type"]
    names = ["model.embed_tokens.weight", "model.norm.weight",
             "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
             "model.layers.0.self_attn.v_proj.weight", "model.layers.2.self_attn.o_proj.weight",
             "model.layers.1.mlp.gate_proj.weight", "model.layers.0.mlp.down_proj.weight",
             "model.layers.0.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight"]
    if not c["tie_word_embeddings"]:
        names.append("lm_head.weight")
    if t == "qwen2":
        names += ["model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.v_proj.bias"]
    if t in ("qwen3", "gemma3_text"):
        names += ["model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight"]
    if t.startswith("gemma"):
        names += ["model.layers.0.pre_feedforward_layernorm.weight",
                  "model.layers.2.post_feedforward_layernorm.weight"]
    out = []
    for n in names:
        for _ in range(2):
            out.append((n, int(rng.integers(P[n].size))))
    return out


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "families"
    only = sys.argv[2:] or list(FAMILIES)
    os.makedirs(out, exist_ok=True)
    for fi, name in enumerate(only):
        c = cfg_of(name)
        rng = np.random.default_rng(1000 + fi)
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        P = make_params(c, rng)
        pre = c.pop("_pre")
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
        write_sharded(d, P)
        text = "hello world 12345 hello<|endoftext|>world<tool> hhe"
        if pre == "spm":
            text = "hello  world 12345<start_of_turn>hello wor\u00e9 d\u00e9 x caf\u00e9\U0001F600 h"
            tj = spm_tokenizer_json()
            ids = spm_encode(text, tj["model"]["vocab"])
            spm_check_with_tokenizers(tj, text, ids)
        else:
            tj = tokenizer_json(pre)
            vocab = dict(tj["model"]["vocab"])
            for a in tj["added_tokens"]:
                vocab[a["content"]] = a["id"]
            ids = bpe_encode(text, pre, vocab)
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(tj, f, ensure_ascii=False, indent=1)
        tokens = rng.integers(0, c["vocab_size"], size=(B, S))
        # a repeated token, so that the embedding gradient sums rows
        tokens[1, 3] = tokens[0, 1]
        z, loss = forward(c, P, tokens)
        grads = []
        for n, i in fd_entries(c, P, rng):
            w = P[n].reshape(-1)
            old = w[i]
            h = 1e-5 * max(1.0, abs(old))
            w[i] = old + h
            lp = forward(c, P, tokens)[1]
            w[i] = old - h
            lm = forward(c, P, tokens)[1]
            w[i] = old
            grads.append({"name": n, "index": i, "value": (lp - lm) / (2 * h)})
        ref = {"family": name, "B": B, "S": S, "tokens": tokens.reshape(-1).tolist(),
               "loss": loss, "logits": z.reshape(-1).tolist(), "grads": grads,
               "text": text, "text_ids": ids, "tokenizer": pre}
        with open(os.path.join(d, "ref.json"), "w") as f:
            json.dump(ref, f)
        print("wrote", d, "loss %.6f" % loss)


if __name__ == "__main__":
    main()
