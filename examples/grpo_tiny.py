#!/usr/bin/env python3
"""A tiny GRPO loop on the CPU with xent's fused LM head (issue 45).

A random Llama (transformers config classes, no download) is the policy.
Each step:
  1. the "sampler" (a bf16 copy of the policy, as an inference engine would
     run it) samples K completions for each of G prompts and records the
     log-probs of what it sampled (log_softmax of its logits in fp32);
     --sampler-head fp32 computes its LM head in fp32 (hidden and weight
     upcast), bf16 keeps the whole model in bf16;
  2. a toy reward: the fraction of completion tokens whose id is even;
     group-normalised advantages (xent.group_advantages);
  3. the trainer (the fp32 policy) recomputes the completions' log-probs and
     entropies with xent.linear_logprobs (fused head: no [T, V] logits),
     and xent.rl.policy_loss gives the PPO loss with token-level truncated
     importance sampling against the sampler's log-probs (cap 2) and an
     entropy bonus; Adam step; the sampler copies the new weights.
--impl torch runs the same loop with the plain PyTorch head (lm_head,
log_softmax, gather) and the same loss written in torch ops.

Per step it logs the loss, the mean reward, the mean entropy, the
trainer-sampler mismatch (mean |lp_trainer - lp_sampler| and K3 =
mean(e^d - 1 - d), d = lp_sampler - lp_trainer) and the TIS clip fraction.

    python3 examples/grpo_tiny.py --steps 30
    python3 examples/grpo_tiny.py --steps 30 --sampler-head fp32
    python3 examples/grpo_tiny.py --steps 30 --impl torch
"""
import argparse
import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "python"))
import xent  # noqa: E402
import xent.rl  # noqa: E402


def build(args):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=64,
                      intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():   # a less flat initial policy than the 0.02 init
        model.lm_head.weight.mul_(25)
    return model


@torch.no_grad()
def sample(sampler, prompts, L, head_fp32, gen):
    """Autoregressive sampling at temperature 1; returns the completions
    [N, L] and the sampler's log-probs of them [N, L] (float32)."""
    ids = prompts
    lps = []
    W = sampler.lm_head.weight
    for _ in range(L):
        h = sampler.model(input_ids=ids).last_hidden_state[:, -1]
        if head_fp32:
            logits = h.float() @ W.float().T
        else:
            logits = sampler.lm_head(h)                 # bf16 logits
        logp = torch.log_softmax(logits.float(), -1)
        tok = torch.multinomial(logp.exp(), 1, generator=gen)
        lps.append(logp.gather(1, tok))
        ids = torch.cat([ids, tok], 1)
    return ids[:, prompts.shape[1]:], torch.cat(lps, 1)


def trainer_logprobs(model, prompts, comp, impl):
    """Per-token log-probs and entropies of the completions under the fp32
    policy: xent's fused head, or the plain PyTorch head."""
    P = prompts.shape[1]
    ids = torch.cat([prompts, comp], 1)
    hidden = model.model(input_ids=ids).last_hidden_state[:, P - 1:-1]
    if impl == "xent":
        return xent.linear_logprobs(hidden, model.lm_head.weight, comp,
                                    entropy=True)
    logp = torch.log_softmax(model.lm_head(hidden).float(), -1)
    lp = logp.gather(-1, comp[..., None])[..., 0]
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


def torch_loss(lp, old, adv, sampler_lp, ent, eps=0.2, cap=2.0, coef=1e-3):
    """The same PPO + token TIS (truncate) + entropy bonus in torch ops."""
    r = torch.exp((lp - old).clamp(-20, 20))
    A = adv[:, None]
    tok = torch.maximum(-A * r, -A * r.clamp(1 - eps, 1 + eps))
    w = torch.exp((old - sampler_lp).clamp(-20, 20)).clamp(max=cap)
    n = lp.numel()
    loss = (w * tok).sum() / n - coef * ent.sum() / n
    return loss, float((w >= cap).float().mean())


def run(args):
    model = build(args)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = copy.deepcopy(model).to(torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(args.seed + 1)
    G, K, P, L = args.groups, args.group_size, 4, args.length
    log = []
    print("# impl=%s sampler_head=%s steps=%d groups=%d x %d, completion "
          "length %d, vocab %d" % (args.impl, args.sampler_head, args.steps,
                                   G, K, L, args.vocab))
    print("%4s %9s %7s %7s %10s %10s %7s" % ("step", "loss", "reward",
                                            "entropy", "mean|d|", "K3",
                                            "tisclip"))
    t0 = time.time()
    for step in range(args.steps):
        prompts = torch.randint(0, args.vocab, (G, P), generator=gen)
        prompts = prompts.repeat_interleave(K, 0)
        comp, s_lp = sample(sampler, prompts, L,
                            args.sampler_head == "fp32", gen)
        reward = (comp % 2 == 0).float().mean(1)
        adv, _ = xent.group_advantages(reward.view(G, K))
        adv = adv.reshape(-1)
        model.train()
        lp, ent = trainer_logprobs(model, prompts, comp, args.impl)
        old = lp.detach()
        if args.impl == "xent":
            loss, st = xent.rl.policy_loss(
                lp, old, adv, adv_layout="sequence", token_norm=lp.numel(),
                sampler_logprobs=s_lp, tis="token", entropy=ent,
                entropy_coef=1e-3)
            tis_clip = st["tis_clip_frac"]
        else:
            loss, tis_clip = torch_loss(lp, old, adv, s_lp, ent)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            for ps, pm in zip(sampler.parameters(), model.parameters()):
                ps.copy_(pm)
            d = (s_lp.double() - old.double())
            rec = dict(step=step, loss=loss.item(),
                       reward=reward.mean().item(),
                       entropy=ent.detach().mean().item(),
                       mismatch=d.abs().mean().item(),
                       k3=(torch.expm1(d) - d).mean().item(),
                       tis_clip=tis_clip)
        log.append(rec)
        print("%4d %9.5f %7.4f %7.4f %10.3e %10.3e %7.4f"
              % (step, rec["loss"], rec["reward"], rec["entropy"],
                 rec["mismatch"], rec["k3"], rec["tis_clip"]))
    n = len(log)
    mean = {k: sum(r[k] for r in log) / n for k in log[0] if k != "step"}
    print("# mean over %d steps: reward %.4f (first %.4f, last %.4f), "
          "mean|d| %.3e, K3 %.3e, TIS clip %.4f; %.1f s"
          % (n, mean["reward"], log[0]["reward"], log[-1]["reward"],
             mean["mismatch"], mean["k3"], mean["tis_clip"],
             time.time() - t0))
    return log


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--impl", choices=("xent", "torch"), default="xent")
    ap.add_argument("--sampler-head", choices=("bf16", "fp32"),
                    default="bf16")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--length", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    return run(args)


if __name__ == "__main__":
    main()
