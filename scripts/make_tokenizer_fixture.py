#!/usr/bin/env python3
"""Expected token ids for tests/data/model/tokenizer_text.txt from the
reference implementation (the `tokenizers` library) configured as SmolLM2's
tokenizer.json: byte-level BPE with the GGUF's vocabulary and merges,
pre-tokenizer Digits(individual_digits) + ByteLevel(add_prefix_space=False),
control tokens as special added tokens.

usage: make_tokenizer_fixture.py MODEL.gguf [TEXT] [OUT]
(needs: pip install gguf tokenizers)"""
import sys

import gguf
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models,
                        pre_tokenizers)

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
          r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
         r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def field_strings(r, key):
    f = r.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def main():
    path = sys.argv[1]
    text_path = sys.argv[2] if len(sys.argv) > 2 else \
        "tests/data/model/tokenizer_text.txt"
    out = sys.argv[3] if len(sys.argv) > 3 else \
        "tests/data/model/tokenizer_ids.txt"
    r = gguf.GGUFReader(path)
    toks = field_strings(r, "tokenizer.ggml.tokens")
    merges = field_strings(r, "tokenizer.ggml.merges")
    tf = r.fields["tokenizer.ggml.token_type"]
    types = [int(tf.parts[i][0]) for i in tf.data]
    vocab = {t: i for i, t in enumerate(toks)}
    bpe = models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges])
    tk = Tokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(toks, types) if ty == 3])
    text = open(text_path, encoding="utf-8").read()
    ids = tk.encode(text, add_special_tokens=False).ids
    assert tk.decode(ids, skip_special_tokens=False) == text
    with open(out, "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    print(f"{len(ids)} ids -> {out}")
    # The same vocabulary under the Llama 3 and Qwen2 pre-tokenizers (their
    # tokenizer.json: Split(pattern, isolated) + ByteLevel(use_regex=False);
    # Llama 3's BPE ignores merges for whole-token chunks).
    for name, pat, ignore in (("llama3", LLAMA3, True), ("qwen2", QWEN2, False)):
        t2 = Tokenizer(models.BPE(vocab, [tuple(m.split(" ", 1))
                                          for m in merges],
                                  ignore_merges=ignore))
        t2.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        t2.decoder = decoders.ByteLevel()
        t2.add_special_tokens([AddedToken(t, special=True, normalized=False)
                               for t, ty in zip(toks, types) if ty == 3])
        ids2 = t2.encode(text, add_special_tokens=False).ids
        assert t2.decode(ids2, skip_special_tokens=False) == text
        o2 = out.replace("tokenizer_ids", f"tokenizer_ids_{name}")
        with open(o2, "w") as f:
            f.write(" ".join(map(str, ids2)) + "\n")
        print(f"{len(ids2)} ids -> {o2}")


if __name__ == "__main__":
    main()
