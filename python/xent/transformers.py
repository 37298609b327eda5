"""Hugging Face transformers integration (issue 45):

    import xent.transformers
    xent.transformers.apply(model)                 # a model instance
    xent.transformers.apply(LlamaForCausalLM)      # a class (every instance)
    xent.transformers.apply("qwen3", fused=True)   # a family's *ForCausalLM

The causal-LM loss becomes xent's exact cross-entropy:

* fused=False: the model's `loss_function` (transformers' ForCausalLMLoss:
  shift, flatten, cross-entropy, `num_items_in_batch`) is replaced by one
  that calls `xent.cross_entropy` on the logits the model made (any dtype,
  no float32 copy of them).
* fused=True (default): in training (`model.training`) a forward with
  `labels` never makes the logits: the model's own forward runs with
  labels=None and its output embedding (`lm_head`) hands the final hidden
  states back instead of projecting them (it returns an empty [..., 0]
  tensor, so model-specific code after it, e.g. Gemma-2/3's final logit
  soft-capping, runs on nothing); the loss is then
  `xent.linear_cross_entropy(hidden, lm_head.weight, shifted labels,
  softcap=config.final_logit_softcapping, normalizer=num_items_in_batch)`.
  `outputs.logits` is None then. Without labels, in eval mode, and in
  generation the forward is the model's own, untouched.

The model code is not copied: the wrapper works on any *ForCausalLM whose
forward computes `logits = self.lm_head(hidden_states)` and then
`self.loss_function(...)`; tested (python/tests/test_hf_patch.py) on tiny
random Llama, Qwen2, Qwen3, Mistral, Gemma, Gemma-2 and Gemma-3 models.
`revert(model_or_class)` undoes `apply`.
"""
import functools
import importlib
import inspect
import threading
import types

import torch

from . import cross_entropy, linear_cross_entropy

FAMILIES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "mistral": ("mistral", "MistralForCausalLM"),
    "gemma": ("gemma", "GemmaForCausalLM"),
    "gemma2": ("gemma2", "Gemma2ForCausalLM"),
    "gemma3": ("gemma3", "Gemma3ForCausalLM"),
    "gemma3_text": ("gemma3", "Gemma3ForCausalLM"),
}

_TLS = threading.local()


def _family_class(name):
    if name not in FAMILIES:
        raise ValueError("xent.transformers: unknown family %r (one of %s); "
                         "pass the model class or instance instead"
                         % (name, ", ".join(sorted(FAMILIES))))
    mod, cls = FAMILIES[name]
    m = importlib.import_module("transformers.models.%s.modeling_%s"
                                % (mod, mod))
    return getattr(m, cls)


def _num(n):
    if n is None:
        return None
    if isinstance(n, torch.Tensor):
        n = n.item()
    return float(n)


def _shift(labels, shift_labels, ignore_index):
    if shift_labels is not None:
        return shift_labels
    labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
    return labels[..., 1:].contiguous()


def causal_lm_loss(logits, labels, vocab_size=None, num_items_in_batch=None,
                   ignore_index=-100, shift_labels=None, **kwargs):
    """transformers' ForCausalLMLoss with xent's exact cross-entropy: the
    same shift, the same normalization (sum / num_items_in_batch when
    given, else the mean over the counted tokens), rounded once."""
    y = _shift(labels, shift_labels, ignore_index).to(logits.device)
    V = logits.shape[-1] if vocab_size is None else vocab_size
    z = logits.reshape(-1, V)
    if z.dtype == torch.float64:
        z = z.float()
    return cross_entropy(z, y.reshape(-1), ignore_index=ignore_index,
                         reduction="mean",
                         normalizer=_num(num_items_in_batch))


def _capture_forward(self, input):
    """The output embedding's forward while a fused loss is being computed:
    keep the hidden states, return an empty [..., 0] tensor."""
    slot = getattr(_TLS, "slot", None)
    if slot is not None and slot.get("head") is self:
        slot["hidden"] = input
        return input.new_empty(tuple(input.shape[:-1]) + (0,))
    return type(self).forward(self, input)


def _head_of(model):
    head = model.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None),
                                      torch.Tensor):
        raise TypeError("xent.transformers: %s has no output embedding "
                        "with a weight (lm_head)" % type(model).__name__)
    if not getattr(head, "_xent_capture", False):
        head.forward = types.MethodType(_capture_forward, head)
        head._xent_capture = True
    return head


def _fused_forward(orig, opts):
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def forward(self, *args, **kwargs):
        if not getattr(self, "_xent_fused", True):
            return orig(self, *args, **kwargs)
        bound = sig.bind(self, *args, **kwargs)
        labels = bound.arguments.get("labels")
        if labels is None or not self.training:
            return orig(self, *args, **kwargs)
        bound.arguments["labels"] = None
        extra = {}
        for p in sig.parameters.values():
            if p.kind == p.VAR_KEYWORD:
                extra = bound.arguments.get(p.name, {})
        head = _head_of(self)
        slot = {"head": head}
        prev = getattr(_TLS, "slot", None)
        _TLS.slot = slot
        try:
            out = orig(*bound.args, **bound.kwargs)
        finally:
            _TLS.slot = prev
        if "hidden" not in slot:
            raise RuntimeError("xent.transformers: %s.forward did not call "
                               "its output embedding; apply(..., "
                               "fused=False) works for it"
                               % type(self).__name__)
        hidden = slot["hidden"]
        ii = extra.get("ignore_index", -100)
        y = _shift(labels, extra.get("shift_labels"), ii).to(hidden.device)
        cap = getattr(self.config, "final_logit_softcapping", None) or 0.0
        w = head.weight
        if hidden.dtype != w.dtype:
            hidden = hidden.to(w.dtype)
        loss = linear_cross_entropy(
            hidden, w, y, getattr(head, "bias", None), ignore_index=ii,
            reduction="mean", softcap=float(cap),
            normalizer=_num(extra.get("num_items_in_batch")), **opts)
        if isinstance(out, tuple):
            return (loss,) + tuple(out)
        out.loss = loss
        out.logits = None
        return out

    forward._xent_orig = orig
    return forward


def apply(target, fused=True, **opts):
    """Patches a *ForCausalLM instance, class, or family name ('llama',
    'qwen2', 'qwen3', 'mistral', 'gemma', 'gemma2', 'gemma3'). fused: see
    the module docstring. opts go to xent.linear_cross_entropy (e.g.
    grad_accum='main_grad', chunk_rows). Returns the target."""
    if isinstance(target, str):
        target = _family_class(target)
    is_cls = isinstance(target, type)
    cls = target if is_cls else type(target)
    if not hasattr(cls, "get_output_embeddings"):
        raise TypeError("xent.transformers.apply: %r is not a transformers "
                        "model (class)" % (target,))
    revert(target)
    if not fused:
        if is_cls:
            target._loss_function = staticmethod(causal_lm_loss)
        else:
            target.loss_function = causal_lm_loss
        return target
    orig = cls.forward
    new = _fused_forward(orig, opts)
    if is_cls:
        cls.forward = new
    else:
        target.forward = types.MethodType(new, target)
    return target


def revert(target):
    """Undoes apply() on an instance, class or family name."""
    if isinstance(target, str):
        target = _family_class(target)
    if isinstance(target, type):
        if "_loss_function" in target.__dict__:
            del target._loss_function
        f = target.__dict__.get("forward")
        if f is not None and hasattr(f, "_xent_orig"):
            target.forward = f._xent_orig
        return target
    d = target.__dict__
    if d.get("_loss_function") is causal_lm_loss:
        del target._loss_function
    f = d.get("forward")
    if f is not None and hasattr(getattr(f, "__func__", f), "_xent_orig"):
        del target.forward
    return target
