#!/usr/bin/env python3
"""Validates xent's model against transformers' LlamaForCausalLM in fp32.

Phase 1 (--prepare, needs build/xent): exports the checkpoint as an HF
directory (config.json + model.safetensors, fp32: the dequantized GGUF
weights) and runs xent's fp32 forward + backward on the text, writing
tokens, logits, logprobs, loss and every parameter gradient.
Phase 2 (--compare, needs torch + transformers; CPU or CUDA): loads the HF
directory with LlamaForCausalLM (fp32, eager attention, TF32 off), runs the
same tokens with labels = tokens (next-token mean cross-entropy), backward,
and compares:
  logits      relative RMS   <= 1e-5
  loss        relative       <= 1e-6
  gradients   relative RMS   <= 1e-4 for every parameter
Without --prepare/--compare both phases run. Exit status 1 if a bound fails.

usage: validate_transformers.py [--model GGUF] [--xent build/xent]
           [--text tests/data/model/tokenizer_text.txt] [--dir DIR]
           [--device cpu|cuda] [--prepare | --compare] [--json OUT]
"""
import argparse
import json
import os
import subprocess
import sys

DEFAULT_MODEL = os.path.expanduser(
    "~/.cache/xent/SmolLM2-135M-Instruct.Q4_1.gguf")


def prepare(a):
    os.makedirs(a.dir, exist_ok=True)
    hf = os.path.join(a.dir, "hf")
    subprocess.run([a.xent, "model", "export", a.model, "--out", hf,
                    "--dtype", "f32"], check=True)
    subprocess.run([a.xent, "model", "dump", a.model, "--file", a.text,
                    "--out", os.path.join(a.dir, "xent.safetensors")],
                   check=True)


def rel_rms(x, ref):
    import torch
    x = x.double()
    ref = ref.double()
    return (torch.linalg.vector_norm(x - ref) /
            torch.linalg.vector_norm(ref)).item()


def exact_loss_t(logits, ids):
    """Mean next-token cross-entropy computed in float64 (differentiable;
    the gradient flows back into the model's own dtype)."""
    lp = logits.double().log_softmax(-1)
    return -lp[:-1].gather(1, ids[1:, None])[:, 0].mean()


def exact_loss(logits, ids):
    return exact_loss_t(logits.detach(), ids.to(logits.device)).item()


def compare(a):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    ours = load_file(os.path.join(a.dir, "xent.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(
        os.path.join(a.dir, "hf"), torch_dtype=torch.float32,
        attn_implementation="eager").to(a.device)
    model.train(False)  # no dropout; gradients still flow
    ids = ours["tokens"].long().to(a.device)[None, :]
    # transformers' built-in loss upcasts to fp32 (.float()) and runs its
    # cross-entropy there: its own error (~2e-6 relative on this text) and
    # that of its gradient (a per-row bias of softmax - onehot) would be
    # charged to the model. The model runs in fp32; the loss on its logits
    # is computed in float64, and backward goes through the fp32 model.
    out = model(input_ids=ids, labels=ids)
    exact_loss_t(out.logits[0], ids[0]).backward()
    res = {"tokens": int(ids.shape[1]), "device": a.device,
           "torch": torch.__version__}
    import transformers
    res["transformers"] = transformers.__version__
    # transformers' own loss runs its cross-entropy in fp32 (the loss
    # function upcasts with .float()); the reference here is the exact mean
    # next-token cross-entropy of transformers' logits, computed in float64.
    # Both are reported.
    hf_builtin = out.loss.item()
    ref_loss = exact_loss(out.logits[0], ids[0])
    our_loss = ours["loss"].item()
    res["loss_xent"] = our_loss
    res["loss_hf_builtin_fp32_ce"] = hf_builtin
    res["loss_hf"] = ref_loss
    res["loss_rel"] = abs(our_loss - ref_loss) / abs(ref_loss)
    res["loss_rel_vs_builtin"] = abs(our_loss - hf_builtin) / abs(hf_builtin)
    res["logits_rel_rms"] = rel_rms(ours["logits"], out.logits[0].float().cpu())
    worst, worst_name, grads = 0.0, None, {}
    for name, p in model.named_parameters():
        key = "grad." + name
        if key not in ours:
            if name == "lm_head.weight" and model.config.tie_word_embeddings:
                continue
            print(f"missing {key} in xent's dump", file=sys.stderr)
            worst = float("inf")
            continue
        e = rel_rms(ours[key], p.grad.detach().float().cpu())
        grads[name] = e
        if e > worst or worst_name is None:
            worst, worst_name = e, name
    res["grad_rel_rms_max"] = worst
    res["grad_rel_rms_max_param"] = worst_name
    res["grad_rel_rms"] = grads
    ok = (res["logits_rel_rms"] <= 1e-5 and res["loss_rel"] <= 1e-6 and
          worst <= 1e-4)
    res["pass"] = ok
    hf32 = {"loss": ref_loss, "logits": out.logits[0].detach().float().cpu(),
            "grads": {n: q.grad.detach().float().cpu()
                      for n, q in model.named_parameters()}}
    del out, model
    if a.f64:
        f64_reference(a, ids, ours, hf32, res)
    print(f"tokens            {res['tokens']} ({a.device}, torch "
          f"{res['torch']}, transformers {res['transformers']})")
    print(f"loss              xent {our_loss:.9f}  hf {ref_loss:.9f}  "
          f"rel {res['loss_rel']:.3e}  (bound 1e-6; hf logits, CE in f64)")
    print(f"                  hf built-in loss (fp32 CE) {hf_builtin:.9f}  "
          f"rel {res['loss_rel_vs_builtin']:.3e}")
    print(f"logits            rel RMS {res['logits_rel_rms']:.3e}  "
          f"(bound 1e-5)")
    print(f"gradients         max rel RMS {worst:.3e} ({worst_name}) over "
          f"{len(grads)} tensors  (bound 1e-4)")
    med = sorted(grads.values())[len(grads) // 2] if grads else float("nan")
    print(f"                  median rel RMS {med:.3e}")
    print("PASS" if ok else "FAIL")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return ok


def f64_reference(a, ids, ours, hf32, res):
    """The same HF model in float64: the error of xent's fp32 run and of
    transformers' fp32 run, each against it."""
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(
        os.path.join(a.dir, "hf"), torch_dtype=torch.float64,
        attn_implementation="eager").to(a.device)
    m.train(False)
    out = m(input_ids=ids)
    loss = exact_loss_t(out.logits[0], ids[0])
    loss.backward()
    L = loss.item()
    lg = out.logits[0].detach().cpu()
    r = {}
    for who, loss, logits, grad in (
            ("xent_fp32", ours["loss"].item(), ours["logits"],
             lambda n: ours.get("grad." + n)),
            ("hf_fp32", exact_loss(hf32["logits"], ids[0]), hf32["logits"],
             lambda n: hf32["grads"].get(n))):
        worst, wn = 0.0, None
        for n, q in m.named_parameters():
            g = grad(n)
            if g is None:
                continue
            e = rel_rms(g, q.grad.detach().cpu())
            if e > worst or wn is None:
                worst, wn = e, n
        r[who] = {"loss_rel": abs(loss - L) / abs(L),
                  "logits_rel_rms": rel_rms(logits, lg),
                  "grad_rel_rms_max": worst, "grad_worst_param": wn}
        print(f"vs float64 HF     {who:9s}: loss rel {r[who]['loss_rel']:.3e}"
              f"  logits rel RMS {r[who]['logits_rel_rms']:.3e}  grads max "
              f"rel RMS {worst:.3e} ({wn})")
    res["vs_f64"] = r


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--xent", default="build/xent")
    p.add_argument("--text", default="tests/data/model/tokenizer_text.txt")
    p.add_argument("--dir", default="/tmp/xent_validate")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prepare", action="store_true")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--f64", type=int, default=1,
                   help="also compare both against HF in float64 (default 1)")
    a = p.parse_args()
    both = not a.prepare and not a.compare
    if a.prepare or both:
        prepare(a)
    if a.compare or both:
        sys.exit(0 if compare(a) else 1)


if __name__ == "__main__":
    main()
