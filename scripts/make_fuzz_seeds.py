#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (mk/fuzz.mk) into OUT/<target>/.

Every seed is generated here from its description (no binary files in git);
the broken-file corpus of tests/data/broken/ and tests/data/model/tiny.gguf
are added when present. Standard library only.

    python3 scripts/make_fuzz_seeds.py build/fuzz/seeds
"""
import json
import os
import shutil
import struct
import sys


def put(out, target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors -----------------------------------------------------------

def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape, raw bytes)] -> file bytes."""
    header, off, blob = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blob += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


# ---- npy ---------------------------------------------------------------------

def npy(descr, shape, raw, version=1):
    sh = "(" + "".join("%d, " % s for s in shape).rstrip(" ") + ")" if len(shape) != 1 else "(%d,)" % shape[0]
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, sh)
    pre = 10 if version == 1 else 12
    pad = (64 - (pre + len(d) + 1) % 64) % 64
    d = (d + " " * pad + "\n").encode()
    if version == 1:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d + raw
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(d)) + d + raw


# ---- gguf --------------------------------------------------------------------

GT_U32, GT_I32, GT_F32, GT_STR, GT_ARR = 4, 5, 6, 8, 9


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gkv(key, t, v):
    out = gstr(key) + struct.pack("<I", t)
    if t == GT_U32:
        return out + struct.pack("<I", v)
    if t == GT_F32:
        return out + struct.pack("<f", v)
    if t == GT_STR:
        return out + gstr(v)
    et, items = v
    out += struct.pack("<IQ", et, len(items))
    for x in items:
        out += gstr(x) if et == GT_STR else struct.pack("<i", x)
    return out


def gguf(n_layers=1, dim=8, hidden=16, heads=2, kv=1, vocab=8, tokenizer=True, tied=True):
    """A tiny Llama GGUF v3, F32 tensors laid out as llama.cpp requires."""
    hd = dim // heads
    kvs = [gkv("general.architecture", GT_STR, "llama"), gkv("general.alignment", GT_U32, 32)]
    for k, v in [("block_count", n_layers), ("embedding_length", dim), ("feed_forward_length", hidden),
                 ("attention.head_count", heads), ("attention.head_count_kv", kv),
                 ("context_length", 64)]:
        kvs.append(gkv("llama." + k, GT_U32, v))
    kvs.append(gkv("llama.rope.freq_base", GT_F32, 10000.0))
    kvs.append(gkv("llama.attention.layer_norm_rms_epsilon", GT_F32, 1e-5))
    if tokenizer:
        toks = ["a", "b", "c", "ab", "\u0120", "\u0120a", "<s>", "</s>"][:vocab]
        toks += ["t%d" % i for i in range(vocab - len(toks))]
        kvs += [gkv("tokenizer.ggml.model", GT_STR, "gpt2"), gkv("tokenizer.ggml.pre", GT_STR, "smollm"),
                gkv("tokenizer.ggml.tokens", GT_ARR, (GT_STR, toks)),
                gkv("tokenizer.ggml.token_type", GT_ARR, (GT_I32, [3 if t.startswith("<") else 1 for t in toks])),
                gkv("tokenizer.ggml.merges", GT_ARR, (GT_STR, ["a b", "\u0120 a"])),
                gkv("tokenizer.ggml.bos_token_id", GT_U32, 6)]
    shapes = [("token_embd.weight", [dim, vocab])]
    for l in range(n_layers):
        b = "blk.%d." % l
        shapes += [(b + "attn_norm.weight", [dim]), (b + "attn_q.weight", [dim, heads * hd]),
                   (b + "attn_k.weight", [dim, kv * hd]), (b + "attn_v.weight", [dim, kv * hd]),
                   (b + "attn_output.weight", [heads * hd, dim]), (b + "ffn_norm.weight", [dim]),
                   (b + "ffn_gate.weight", [dim, hidden]), (b + "ffn_up.weight", [dim, hidden]),
                   (b + "ffn_down.weight", [hidden, dim])]
    shapes.append(("output_norm.weight", [dim]))
    if not tied:
        shapes.append(("output.weight", [dim, vocab]))
    infos, data, off = b"", b"", 0
    for name, ne in shapes:
        n = 1
        for e in ne:
            n *= e
        raw = struct.pack("<%df" % n, *[((i * 7) % 13) * 0.01 - 0.05 for i in range(n)])
        infos += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", e) for e in ne)
        infos += struct.pack("<IQ", 0, off)
        pad = (32 - len(raw) % 32) % 32
        data += raw + b"\0" * pad
        off += len(raw) + pad
    head = b"GGUF" + struct.pack("<IQQ", 3, len(shapes), len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * ((32 - len(head) % 32) % 32)
    return head + data


# ---- the corpora -------------------------------------------------------------

def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isdir(out):
        shutil.rmtree(out)

    st = "safetensors"
    put(out, st, "one_f32", safetensors([("a", "F32", [2, 2], f32(1, 2, 3, 4))]))
    put(out, st, "two", safetensors([("a", "F32", [2], f32(1, 2)), ("b", "I32", [1], struct.pack("<i", 7))]))
    put(out, st, "meta_bf16", safetensors([("w", "BF16", [3], b"\x80\x3f" * 3)], {"format": "pt"}))
    put(out, st, "empty_tensor", safetensors([("e", "F32", [0], b""), ("a", "F64", [1], struct.pack("<d", 1))]))
    put(out, st, "u8_i64", safetensors([("m", "U8", [4], b"\1\0\1\1"), ("t", "I64", [1], struct.pack("<q", 5))]))

    put(out, "npy", "f32_2x3", npy("<f4", [2, 3], f32(*range(6))))
    put(out, "npy", "i64_v2", npy("<i8", [2], struct.pack("<2q", 1, 2), version=2))
    put(out, "npy", "f16_scalar", npy("<f2", [], b"\x00\x3c"))
    put(out, "npy", "u1_v3", npy("|u1", [3], b"\1\2\3", version=3))

    put(out, "gguf", "tiny_tok", gguf())
    put(out, "gguf", "tiny_untied_2l", gguf(n_layers=2, tied=False, tokenizer=False))

    def tok(pre, tokens, merges, text):
        return bytes([pre]) + b"\xfe".join(tokens) + b"\xff" + b"\xfe".join(merges) + b"\xff" + text
    put(out, "tokenizer", "merges", tok(1, [b"he", b"the", b"\x01<|s|>"], [b"h e", b"t he"],
                                       b"the <|s|> 123 hello"))
    put(out, "tokenizer", "llama3", tok(2, [b"ab", b"\xc4\xa0ab"], [b"a b", b"\xc4\xa0 ab"],
                                        "ab ab's 12345 \u00e9t\u00e9\n\n".encode()))
    put(out, "tokenizer", "qwen2", tok(3, [b"\x01<x>", b"\x01<x><y>"], [], b"<x><y> <x> 1 2"))

    cfg = {"model_type": "llama", "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 64,
           "max_position_embeddings": 64, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
           "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": [2, 3]}
    put(out, "hf_config", "llama", json.dumps(cfg, indent=1))
    q = dict(cfg, model_type="qwen2", attention_bias=True, use_sliding_window=False)
    put(out, "hf_config", "qwen2", json.dumps(q))
    l3 = dict(cfg, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    put(out, "hf_config", "llama3", json.dumps(l3))
    g2 = dict(cfg, model_type="gemma2", hidden_activation="gelu_pytorch_tanh", sliding_window=4,
              query_pre_attn_scalar=8, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    put(out, "hf_config", "gemma2", json.dumps(g2))
    q3 = dict(cfg, model_type="qwen3", layer_types=["full_attention"] * 2)
    put(out, "hf_config", "qwen3", json.dumps(q3))

    # tokenizer.json: the tiny byte-level BPEs of tests/families/make_families.py
    sys.path.insert(0, os.path.join(root, "tests", "families"))
    try:  # (that script needs numpy)
        import make_families as mf
    except ImportError:
        mf = None
    for pre in ("gpt2", "smollm", "llama-bpe", "qwen2") if mf else ():
        put(out, "hf_tokenizer", pre, json.dumps(mf.tokenizer_json(pre)).encode())
    if mf:
        put(out, "hf_tokenizer", "spm", json.dumps(mf.spm_tokenizer_json()).encode())

    put(out, "compare", "text", b"\x00" + b"-0.5\n-1.25\nnan\n-inf\n-0\n")
    put(out, "compare", "ints", b"\x01" + b"1\n2\n3\n")
    put(out, "compare", "jsonl", b"\x03" + b'{"logprobs": [-0.5, -1.0], "tokens": [1, 2], "prompt_len": 1}\n'
        b'{"logprobs": [-2.0], "tokens": [3]}\n')
    put(out, "compare", "json_ids", b"\x02" + b"[[1, 2, 3], [4]]")
    put(out, "compare", "json_obj", b"\x02" + b'{"tokens": [[5, 6], [7]]}')

    put(out, "cli", "flags", b"--int\x003\x00--float=0.25\x00--bool\x00A\x00B")
    put(out, "cli", "enum_dtype", b"--enum\x00sum\x00--dtype\x00bf16\x00--list\x001,2.5,-3")
    put(out, "cli", "help", b"--help")
    put(out, "cli", "dashdash", b"--str\x00-x\x00--\x00--int")

    # the broken-file corpus and the test model, when present
    broken = os.path.join(root, "tests", "data", "broken")
    if os.path.isdir(broken):
        for f in sorted(os.listdir(broken)):
            t = "npy" if f.endswith(".npy") else "safetensors" if f.endswith(".safetensors") else None
            if t:
                shutil.copy(os.path.join(broken, f), os.path.join(out, t, "broken_" + f))
    tiny = os.path.join(root, "tests", "data", "model", "tiny.gguf")
    if os.path.isfile(tiny):
        shutil.copy(tiny, os.path.join(out, "gguf", "tiny.gguf"))
    n = sum(len(fs) for _, _, fs in os.walk(out))
    print("make_fuzz_seeds: %d seeds in %s" % (n, out))


if __name__ == "__main__":
    main()
