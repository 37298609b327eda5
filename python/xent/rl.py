"""xent.rl: RL policy losses for torch training loops on the outputs of the
fused LM head (issue 45).

    lp, ent = xent.linear_logprobs(hidden, lm_head.weight, tokens,
                                   temperature=T, entropy=True)
    loss, stats = xent.rl.policy_loss(lp, old_lp, adv, mask=mask,
                                      token_norm=n_tokens, entropy=ent,
                                      entropy_coef=1e-3)
    loss.backward()          # into lp and ent, and through them the model

`policy_loss` is the C library's xent_rl_policy_loss (every loss, clip,
aggregation, TIS and KL option of `xent rl`, the same defaults:
xent_rl_loss_opts_init, eps 0.2 / 0.2, log-ratio clamp 20, TIS cap 2):
the loss and its gradient with respect to the new log-probs come from one C
call, and autograd multiplies that gradient by the upstream one (no torch
re-derivation of the formulas). The optional entropy bonus
`- entropy_coef * agg(entropy)` uses the same aggregation weights as the
policy term, in torch ops.

Adapters: `trl_loss(...)` takes the tensors TRL's GRPOTrainer has in its
loss step (per_token_logps, old / sampling / ref log-probs, advantages,
completion_mask) and its loss_type names; `verl_policy_loss(...)` has the
signature of verl's policy-loss registry (core_algos.register_policy_loss)
and `register_verl()` registers it as "xent" when verl is installed.
"""
from ._rl import (group_advantages, batch_normalize, rl_diagnostics,  # noqa
                  check_logprobs, kl, policy_loss as _policy_loss)

__all__ = ["policy_loss", "agg_weights", "group_advantages",
           "batch_normalize", "rl_diagnostics", "check_logprobs", "kl",
           "trl_loss", "verl_policy_loss", "register_verl"]

_STAT_KEYS = ("n_tokens", "n_seqs", "n_clamped", "n_clip_low",
              "n_clip_high", "n_dual_clip", "n_tis_clamped",
              "n_tis_truncated", "n_tis_masked", "n_kl_clamped")


def agg_weights(shape, mask=None, offsets=None, *, agg="token_sum",
                token_norm=None, seq_norm=None, device=None):
    """The per-token factor of the aggregation (docs/rl.md): token_sum
    1/token_norm, seq_mean_token_mean 1/(n_i seq_norm), seq_mean_token_sum
    1/(seq_norm token_norm); 0 on masked tokens. float64 tensor of shape."""
    import torch
    m = torch.ones(shape, dtype=torch.float64, device=device) if mask is None \
        else mask.to(device=device, dtype=torch.float64)
    if agg == "token_sum":
        return m / float(token_norm)
    if agg == "seq_mean_token_sum":
        return m / (float(seq_norm) * float(token_norm))
    if agg != "seq_mean_token_mean":
        raise ValueError("agg = %r" % (agg,))
    if len(shape) == 2 and offsets is None:
        n = m.sum(1, keepdim=True).clamp(min=1)
        return m / (n * float(seq_norm))
    flat = m.reshape(-1)
    if offsets is None:
        offsets = torch.tensor([0, flat.numel()])
    off = [int(x) for x in offsets]
    w = torch.zeros_like(flat)
    for a, b in zip(off[:-1], off[1:]):
        n = float(flat[a:b].sum())
        if n > 0:
            w[a:b] = flat[a:b] / (n * float(seq_norm))
    return w.reshape(shape)


def policy_loss(new_logprobs, old_logprobs, advantages, *, entropy=None,
                entropy_coef=0.0, **kw):
    """(loss, stats): loss a 0-d float32 tensor, differentiable in
    new_logprobs (the C gradient) and, with entropy given and
    entropy_coef != 0, in entropy (loss -= entropy_coef * sum_t a_t H_t with
    a_t the aggregation's per-token factor). Keywords: those of
    xent.policy_loss (loss='ppo'|'cispo'|'gspo'|'reinforce', mask, offsets,
    eps_low, eps_high, dual_clip, log_ratio_clamp, agg, token_norm,
    seq_norm, sampler_logprobs, tis, tis_mode, tis_cap, ref_logprobs, kl,
    kl_coef, ...). stats: the C counts, plus 'clip_frac' (clipped tokens /
    counted tokens), 'tis_clip_frac' (truncated or masked / counted),
    'token_loss' and, with entropy, 'entropy_mean'."""
    loss, _grad, st = _policy_loss(new_logprobs, old_logprobs, advantages,
                                   **kw)
    n = max(int(st["n_tokens"]), 1)
    stats = {k: int(st[k]) for k in _STAT_KEYS}
    stats["kl_mean"] = float(st["kl_mean"])
    stats["clip_frac"] = (st["n_clip_low"] + st["n_clip_high"]) / n
    stats["tis_clip_frac"] = (st["n_tis_truncated"] + st["n_tis_masked"]) / n
    stats["token_loss"] = st["token_loss"]
    if entropy is not None:
        w = agg_weights(tuple(new_logprobs.shape), kw.get("mask"),
                        kw.get("offsets"), agg=kw.get("agg", "token_sum"),
                        token_norm=kw.get("token_norm"),
                        seq_norm=kw.get("seq_norm"),
                        device=new_logprobs.device)
        m = w != 0
        stats["entropy_mean"] = float(entropy.detach()[m].double().mean()) \
            if bool(m.any()) else 0.0
        if entropy_coef:
            bonus = (entropy.double() * w).sum()
            loss = (loss.double() - float(entropy_coef) * bonus).float()
    return loss, stats


# --- TRL -----------------------------------------------------------------

_TRL_AGG = {"grpo": "seq_mean_token_mean", "bnpo": "token_sum",
            "dr_grpo": "token_sum", "dapo": "token_sum"}


def trl_loss(per_token_logps, old_per_token_logps, advantages,
             completion_mask, *, loss_type="dapo", epsilon_low=0.2,
             epsilon_high=0.2, beta=0.0, ref_per_token_logps=None,
             sampling_per_token_logps=None, tis_cap=None,
             max_completion_length=None, num_items_in_batch=None,
             entropy=None, entropy_coef=0.0, importance_sampling_level="token",
             delta=None):
    """The loss of TRL's GRPOTrainer on its own tensors ([B, L] log-probs
    and completion_mask, advantages [B]), computed by xent:

      loss_type 'grpo'    mean over sequences of the per-sequence token mean
      loss_type 'bnpo'    sum / completion_mask.sum()
      loss_type 'dr_grpo' sum / (B * max_completion_length)
      loss_type 'dapo'    sum / num_items_in_batch (the global token count;
                          completion_mask.sum() when not given)

    importance_sampling_level 'sequence' is GSPO; beta > 0 adds the K3 KL to
    ref_per_token_logps; sampling_per_token_logps with tis_cap applies
    token-level truncated importance sampling (TRL's vLLM correction);
    delta is TRL's two-sided clip (the dual clip). Use it in a GRPOTrainer
    subclass's compute_loss (docs/python.md). Returns (loss, stats)."""
    mask = completion_mask.bool()
    B, L = per_token_logps.shape
    agg = _TRL_AGG.get(loss_type)
    if agg is None:
        raise ValueError("loss_type = %r: one of %s" % (loss_type,
                                                        sorted(_TRL_AGG)))
    kw = dict(mask=mask, agg=agg, eps_low=epsilon_low, eps_high=epsilon_high,
              loss="gspo" if importance_sampling_level == "sequence"
              else "ppo")
    ntok = float(mask.sum())
    if loss_type == "grpo":
        kw["seq_norm"] = B
    elif loss_type == "bnpo":
        kw["token_norm"] = max(ntok, 1.0)
    elif loss_type == "dr_grpo":
        kw["token_norm"] = B * (max_completion_length or L)
    else:
        n = num_items_in_batch
        kw["token_norm"] = max(float(n if n is not None else ntok), 1.0)
    if old_per_token_logps is None:
        old_per_token_logps = per_token_logps.detach()
    if beta:
        kw.update(ref_logprobs=ref_per_token_logps, kl="k3", kl_coef=beta)
    if sampling_per_token_logps is not None and tis_cap:
        kw.update(sampler_logprobs=sampling_per_token_logps, tis="token",
                  tis_cap=tis_cap)
    if delta is not None:
        kw["dual_clip"] = delta
    return policy_loss(per_token_logps, old_per_token_logps,
                       advantages.reshape(B), adv_layout="sequence",
                       entropy=entropy, entropy_coef=entropy_coef, **kw)


# --- verl ----------------------------------------------------------------

_VERL_AGG = {"token-mean": "token_sum",
             "seq-mean-token-mean": "seq_mean_token_mean",
             "seq-mean-token-sum": "seq_mean_token_sum",
             "seq-mean-token-sum-norm": "token_sum"}


def _cfg(config, name, default):
    if config is None:
        return default
    v = config.get(name, default) if isinstance(config, dict) else \
        getattr(config, name, default)
    return default if v is None else v


def verl_policy_loss(old_log_prob, log_prob, advantages, response_mask,
                     loss_agg_mode="token-mean", config=None,
                     rollout_log_probs=None, rollout_is_weights=None,
                     **_ignored):
    """verl's policy-loss function signature (core_algos.register_policy_loss):
    PPO with clip_ratio_low / clip_ratio_high (fallback clip_ratio, 0.2),
    the dual clip clip_ratio_c (3.0), verl's loss_agg_mode, and token TIS
    against rollout_log_probs when config.tis_imp_ratio_cap > 0. Returns
    (pg_loss, metrics) with metrics pg_clipfrac, pg_clipfrac_lower, ppo_kl
    and tis_clip_frac."""
    mask = response_mask.bool()
    B, L = log_prob.shape
    clip = _cfg(config, "clip_ratio", 0.2)
    agg = _VERL_AGG.get(loss_agg_mode)
    if agg is None:
        raise ValueError("loss_agg_mode = %r: one of %s"
                         % (loss_agg_mode, sorted(_VERL_AGG)))
    kw = dict(mask=mask, agg=agg, eps_low=_cfg(config, "clip_ratio_low", clip),
              eps_high=_cfg(config, "clip_ratio_high", clip),
              dual_clip=_cfg(config, "clip_ratio_c", 3.0))
    ntok = max(float(mask.sum()), 1.0)
    if loss_agg_mode == "token-mean":
        kw["token_norm"] = ntok
    elif loss_agg_mode == "seq-mean-token-mean":
        kw["seq_norm"] = B
    elif loss_agg_mode == "seq-mean-token-sum":
        kw.update(seq_norm=B, token_norm=1.0)
    else:
        kw["token_norm"] = float(_cfg(config, "loss_scale_factor", None)
                                 or L) * B
    cap = _cfg(config, "tis_imp_ratio_cap", 0)
    if rollout_log_probs is not None and cap and cap > 0:
        kw.update(sampler_logprobs=rollout_log_probs, tis="token",
                  tis_cap=cap)
    loss, st = policy_loss(log_prob, old_log_prob, advantages, **kw)
    n = max(st["n_tokens"], 1)
    with __import__("torch").no_grad():
        d = (log_prob - old_log_prob).double()[mask]
        ppo_kl = float(-d.mean()) if d.numel() else 0.0
    metrics = {"actor/pg_clipfrac": st["n_clip_high"] / n,
               "actor/pg_clipfrac_lower": st["n_clip_low"] / n,
               "actor/ppo_kl": ppo_kl,
               "actor/tis_clip_frac": st["tis_clip_frac"]}
    return loss, metrics


def register_verl(name="xent"):
    """Registers verl_policy_loss in verl's policy-loss registry (set
    actor.policy_loss.loss_mode=<name>). Needs verl."""
    from verl.trainer.ppo.core_algos import register_policy_loss
    return register_policy_loss(name)(verl_policy_loss)
