"""TRL integration (issue 45): TRL's trainers score completions through a
fused LM head; this module puts xent's exact one under them.

TRL (>= 1.x) patches the policy's forward with `trl.trainer.utils.
add_fused_lm_head`: `model(..., labels=labels, fused_lm_head=True)` returns a
`FusedCausalLMOutput` whose `log_probs` / `entropy` ([B, L-1], 0 where the
label is -100) GRPOTrainer's loss uses (`_get_per_token_logps_and_entropies`
-> `_compute_loss`), for the policy, the old policy and the reference model
alike. `add_fused_lm_head` below has the same contract and computes those
fields with `xent.linear_logprobs(hidden, lm_head.weight, labels,
temperature=..., softcap=final_logit_softcapping, entropy=True)`: exact
log-probs and entropy, differentiable in both, no [T, V] logits tensor, the
CPU head on CPU tensors and the chunked CUDA head on GPU tensors.

    import xent.trl
    trainer = xent.trl.GRPOTrainer(model=model, args=GRPOConfig(...),
                                   reward_funcs=reward, train_dataset=ds,
                                   processing_class=tok)
    trainer.train()

or, for every TRL trainer built afterwards (GRPO, RLOO, DPO, KTO, SFT):

    xent.trl.apply()        # xent.trl.revert() undoes it

`xent_options` (GRPOTrainer keyword, or add_fused_lm_head keywords) go to
`xent.linear_logprobs`: e.g. chunk_rows, grad_accum="main_grad" /
"fp32_grad" (the LM head's weight gradient accumulated in fp32),
process_group (a vocabulary-parallel head). GRPOTrainer(xent_loss=True)
also computes the policy loss with `xent.rl.trl_loss` (the C library's
policy loss, loss types grpo / bnpo / dr_grpo / dapo) instead of TRL's
torch formulas.

Only the `log_probs` and `entropy` outputs are xent's; a trainer that asks
for more (log_sum_sq_probs, mean_logits, is_top1) or a MoE config that
wants router logits gets TRL's own fused head unchanged.
"""
import contextlib
import functools
import types

import torch

import trl as _trl
import trl.trainer.utils as _trl_utils

from . import linear_logprobs

__all__ = ["add_fused_lm_head", "GRPOTrainer", "apply", "revert",
           "SUPPORTED_OUTPUTS", "patch_trainer"]

SUPPORTED_OUTPUTS = ("log_probs", "entropy")
_TRL_ADD = _trl_utils.add_fused_lm_head        # TRL's own, kept for fallback
_TRAINER_MODULES = ("grpo_trainer", "rloo_trainer", "dpo_trainer",
                    "kto_trainer", "sft_trainer")


def _logit_scale(tc):
    """The scalar the model multiplies its logits by before any soft-cap
    (TRL's reading of the config fields; 1.0 when none)."""
    s = getattr(tc, "logit_scale", None)
    if s is None:
        s = getattr(tc, "output_multiplier", None)
    if s is None:
        s = getattr(tc, "lm_head_multiplier", None)
    if s is None and getattr(tc, "logits_scaling", None) is not None:
        ls = tc.logits_scaling
        s = ls if tc.model_type == "hyperclovax" else 1 / ls
    return 1.0 if s is None else float(s)


def add_fused_lm_head(model, temperature=1.0, cast_lm_head_to_fp32=False,
                      outputs=("log_probs",), **xent_options):
    """TRL's add_fused_lm_head with xent's kernel: afterwards
    `model(..., labels=labels, fused_lm_head=True)` returns TRL's
    FusedCausalLMOutput (loss, log_probs, entropy, label_mask) computed by
    `xent.linear_logprobs`; without fused_lm_head=True the forward is the
    one the model had (generation untouched). Returns the model."""
    tc = model.config.get_text_config()
    if set(outputs) - set(SUPPORTED_OUTPUTS) or \
            getattr(tc, "output_router_logits", False):
        _TRL_ADD(model, temperature=temperature,
                 cast_lm_head_to_fp32=cast_lm_head_to_fp32, outputs=outputs)
        return model
    original_forward = model.forward
    softcap = getattr(tc, "final_logit_softcapping", None) or 0.0
    scale = _logit_scale(tc)
    want_ent = "entropy" in outputs
    opts = dict(xent_options)

    @functools.wraps(type(model).forward)
    def _fused_forward(self, *args, fused_lm_head=False, labels=None,
                       shift_labels=None, num_items_in_batch=None, **kwargs):
        if not fused_lm_head:
            if labels is not None:
                kwargs["labels"] = labels
            if shift_labels is not None:
                kwargs["shift_labels"] = shift_labels
            if num_items_in_batch is not None:
                kwargs["num_items_in_batch"] = num_items_in_batch
            return original_forward(*args, **kwargs)
        kwargs["use_cache"] = False
        # looked up on each call: FSDP and PEFT replace them after patching
        backbone = self.base_model(*args, **kwargs)
        if shift_labels is None:
            hidden = backbone.last_hidden_state[:, :-1]
            labels = labels[:, 1:]
        else:
            hidden = backbone.last_hidden_state
            labels = shift_labels
        lp, ent, mask = head_logprobs(self.get_output_embeddings(), hidden,
                                      labels, temperature=temperature,
                                      softcap=softcap, scale=scale,
                                      entropy=want_ent,
                                      fp32=cast_lm_head_to_fp32, **opts)
        n = mask.sum().clamp(min=1) if num_items_in_batch is None \
            else num_items_in_batch
        return _trl_utils.FusedCausalLMOutput(
            loss=-lp.sum() / n, log_probs=lp, entropy=ent, label_mask=mask)

    model.forward = types.MethodType(_fused_forward, model)
    model._xent_fused_lm_head = True
    return model


def head_logprobs(lm_head, hidden, labels, *, temperature=1.0, softcap=0.0,
                  scale=1.0, entropy=True, fp32=False, ignore_index=-100,
                  **xent_options):
    """(log_probs, entropy or None, mask) of `labels` [B, L] under
    lm_head(hidden [B, L, H]) / temperature: xent.linear_logprobs over the
    positions whose label is not ignore_index only (prompt and padding
    positions cost nothing), scattered back to [B, L] with 0 elsewhere."""
    weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
    DTensor = getattr(_trl_utils, "DTensor", None)
    if DTensor is not None and isinstance(weight, DTensor):
        weight = weight.full_tensor()
        if bias is not None:
            bias = bias.full_tensor()
    hidden = hidden.to(weight.device)
    labels = labels.to(weight.device)
    mask = labels != ignore_index
    gather = getattr(_trl_utils, "maybe_gather_lm_head_ctx", None)
    ctx = gather(weight, bias) if gather is not None and \
        isinstance(weight, torch.nn.Parameter) else contextlib.nullcontext()
    with ctx, torch.autocast(hidden.device.type, enabled=False):
        if fp32:
            hidden, weight = hidden.float(), weight.float()
            bias = None if bias is None else bias.float()
        elif hidden.dtype != weight.dtype:
            hidden = hidden.to(weight.dtype)
        h = hidden[mask]                                      # [N, H]
        if scale != 1.0:
            h = h * scale
            bias = None if bias is None else bias * scale
        res = linear_logprobs(h, weight, labels[mask], bias,
                              temperature=temperature, softcap=softcap,
                              entropy=entropy, ignore_index=ignore_index,
                              **xent_options)
    lp, ent = res if entropy else (res, None)
    # masked_scatter keeps the output connected to the model even when no
    # label counts (a differentiable zero, as TRL's head does)
    lp = lp.new_zeros(mask.shape).masked_scatter(mask, lp)
    if ent is not None:
        ent = ent.new_zeros(mask.shape).masked_scatter(mask, ent)
    return lp, ent, mask


def patch_trainer(trainer, outputs=SUPPORTED_OUTPUTS, **xent_options):
    """Puts xent's fused head over the one TRL's trainer installed on its
    policy (and reference model)."""
    from transformers.utils import is_peft_available
    model = trainer.model
    if is_peft_available():
        from peft import PeftModel
        if isinstance(model, PeftModel):
            model = model.get_base_model()
    args = trainer.args
    temp = getattr(trainer, "temperature", getattr(args, "temperature", 1.0))
    fp32 = bool(getattr(args, "cast_lm_head_to_fp32", False))
    add_fused_lm_head(model, temperature=temp, cast_lm_head_to_fp32=fp32,
                      outputs=outputs, **xent_options)
    ref = getattr(trainer, "ref_model", None)
    if ref is not None:
        add_fused_lm_head(ref, temperature=temp, cast_lm_head_to_fp32=fp32,
                          **xent_options)
    return trainer


class GRPOTrainer(_trl.GRPOTrainer):
    """trl.GRPOTrainer with xent's fused LM head (log-probs and entropy of
    the policy, old policy and reference model). Extra keywords:
    xent_options (dict, passed to xent.linear_logprobs) and xent_loss
    (True: the policy loss by xent.rl.trl_loss, for loss types grpo, bnpo,
    dr_grpo, dapo without TRL's vLLM / off-policy-mask / entropy-mask
    extras; the entropy bonus entropy_coef included)."""

    def __init__(self, *args, xent_options=None, xent_loss=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.xent_options = dict(xent_options or {})
        self.xent_loss = bool(xent_loss)
        patch_trainer(self, **self.xent_options)

    def _compute_loss(self, model, inputs):
        if not self.xent_loss or not self._xent_loss_applies():
            return super()._compute_loss(model, inputs)
        return xent_grpo_loss(self, model, inputs)

    def _xent_loss_applies(self):
        a = self.args
        return (self.loss_type in ("grpo", "bnpo", "dr_grpo", "dapo")
                and not self.use_vllm and self.top_entropy_quantile >= 1.0
                and self.off_policy_mask_threshold is None
                and not self.aux_loss_enabled
                and not getattr(self, "use_adaptive_entropy", False)
                and not (self.beta and
                         getattr(a, "use_bias_correction_kl", False)))


def xent_grpo_loss(trainer, model, inputs):
    """GRPOTrainer._compute_loss's loss (the cases _xent_loss_applies
    admits) with the policy term from xent.rl.trl_loss; logs TRL's entropy
    and clip metrics."""
    from .rl import trl_loss
    t = trainer
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    keep = inputs["completion_ids"].size(1)
    mask = inputs["completion_mask"]
    if "tool_mask" in inputs:
        mask = mask * inputs["tool_mask"]
    lp, ent, _ = t._get_per_token_logps_and_entropies(
        model, ids, am, keep, compute_entropy=True,
        token_type_ids=inputs.get("token_type_ids"))
    mode = "train" if t.model.training else "eval"
    accum = t.current_gradient_accumulation_steps if mode == "train" else 1.0
    n_items = None
    if t.loss_type == "dapo":
        # TRL: the generation batch's token count over the processes,
        # rescaled to one accumulation window
        n_items = inputs["num_items_in_batch"].clamp(min=1.0) / \
            t.accelerator.num_processes
        if mode == "train":
            n_items = n_items * accum / t.args.steps_per_generation
        accum = 1.0
    adv = inputs["advantages"]
    loss, stats = trl_loss(
        lp, inputs.get("old_per_token_logps"), adv.reshape(-1), mask,
        loss_type=t.loss_type, epsilon_low=t.epsilon_low,
        epsilon_high=t.epsilon_high, beta=t.beta,
        ref_per_token_logps=inputs.get("ref_per_token_logps"),
        max_completion_length=t.max_completion_length,
        num_items_in_batch=n_items, delta=t.args.delta,
        importance_sampling_level=t.importance_sampling_level)
    loss = loss / accum
    if t._entropy_bonus_enabled:
        m = mask.to(ent.dtype)
        loss = loss - t.entropy_coef * (ent * m).sum() / \
            m.sum().clamp(min=1.0) / (t.current_gradient_accumulation_steps
                                      if mode == "train" else 1.0)
    m = mask.float()
    t._metrics[mode]["entropy"].append(
        float((ent.detach() * m).sum() / m.sum().clamp(min=1.0)))
    t._metrics[mode]["clip_ratio/region_mean"].append(
        float(stats.get("clip_frac", 0.0)))
    return loss


_saved = {}


def apply():
    """Every TRL trainer built from now on uses xent's fused head (the
    trainer modules' add_fused_lm_head is replaced; revert() restores)."""
    import importlib
    for name in _TRAINER_MODULES:
        try:
            mod = importlib.import_module("trl.trainer." + name)
        except ImportError:
            continue
        if getattr(mod, "add_fused_lm_head", None) is None:
            continue
        _saved.setdefault(name, mod.add_fused_lm_head)
        mod.add_fused_lm_head = add_fused_lm_head


def revert():
    import importlib
    for name, fn in list(_saved.items()):
        importlib.import_module("trl.trainer." + name).add_fused_lm_head = fn
        del _saved[name]
