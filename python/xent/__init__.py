"""xent: exact token log-probabilities and cross-entropy losses.

Works on NumPy arrays and on PyTorch tensors (CPU, and CUDA when libxent
was built with it); see docs/python.md.

    import xent
    loss = xent.cross_entropy(logits, labels)          # torch: autograd
    lp = xent.logprobs(logits, labels)                 # forward only
    loss, grad = xent.cross_entropy_grad(x, y)         # NumPy gradient
    adv, info = xent.group_advantages(rewards, group_ids)  # RL (docs/python.md)
"""
import importlib.util
import sys

from . import _capi
from ._capi import (XentError, XentTypeError, abi_mismatches,
                    set_num_threads, num_threads)

from ._rl import (group_advantages, batch_normalize, policy_loss, kl,
                  rl_diagnostics, check_logprobs)
from ._sampler import sampler_logprobs

__all__ = ["cross_entropy", "cross_entropy_grad", "logprobs",
           "XentError", "XentTypeError", "version",
           "library_path", "cuda_available", "abi_mismatches",
           "group_advantages", "batch_normalize", "policy_loss", "kl",
           "rl_diagnostics", "check_logprobs", "linear_cross_entropy",
           "linear_logprobs", "set_num_threads", "num_threads",
           "sampler_logprobs"]
__version__ = "0.1.0"


def _torch_present():
    """torch is installed (found without importing it: `import xent` stays
    fast and works where torch is absent or blocked)."""
    if sys.modules.get("torch") is not None:
        return True
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):   # sys.modules["torch"] = None etc.
        return False


# torch, when present, adds the nn.Module (loaded on first use, __getattr__
# below); `from xent import *` never imports torch where it is absent.
if _torch_present():
    __all__.append("CrossEntropyLoss")


def _is_torch(x):
    torch = sys.modules.get("torch")   # a tensor implies torch is imported
    return torch is not None and isinstance(x, torch.Tensor)


def version():
    """The C library's version string, e.g. '0.1.0 (cpu)'."""
    return _capi.version()


def library_path():
    """Path of the loaded libxent.so."""
    _capi.LIB.dll()
    return _capi.LIB.path


def cuda_available():
    """True when libxent has CUDA kernels and torch sees a GPU."""
    if sys.modules.get("torch") is None:
        try:
            import torch  # noqa: F401
        except ImportError:
            return False
    from . import _torch
    return _torch.cuda_available()


def cross_entropy(logits, labels, *, ignore_index=-100, reduction="mean",
                  normalizer=None, temperature=1.0, softcap=None, z_loss=0.0,
                  label_smoothing=0.0, inplace_backward=False,
                  process_group=None, vocab_start=0, vocab_total=None,
                  **kw):
    """Cross-entropy of logits [..., V] against labels [...].

    torch tensors: differentiable (torch.autograd.Function); with
    process_group, each rank holds the columns [vocab_start, vocab_start+V)
    and the result equals the unsharded loss. NumPy arrays: forward only
    (see cross_entropy_grad); extra keyword dtype='bf16'/'f16' for uint16
    bit patterns. reduction: 'mean' (over counted rows, or / normalizer),
    'sum' or 'none'."""
    common = dict(ignore_index=ignore_index, reduction=reduction,
                  normalizer=normalizer, temperature=temperature,
                  softcap=softcap, z_loss=z_loss,
                  label_smoothing=label_smoothing, vocab_start=vocab_start)
    if _is_torch(logits):
        from . import _torch
        return _torch.cross_entropy(logits, labels,
                                    inplace_backward=inplace_backward,
                                    process_group=process_group,
                                    vocab_total=vocab_total, **common, **kw)
    if process_group is not None or inplace_backward:
        raise XentError("process_group and inplace_backward apply to torch "
                        "tensors; for NumPy use cross_entropy_grad(..., "
                        "inplace=True)")
    from . import _np
    return _np.cross_entropy(logits, labels, vocab_total=vocab_total or 0,
                             **common, **kw)


def cross_entropy_grad(logits, labels, **kw):
    """NumPy: (loss, dloss/dlogits) in one pass; see _np.cross_entropy_grad
    for the keywords (grad_output, inplace, grad_dtype, dtype, ...)."""
    if _is_torch(logits):
        raise XentError("cross_entropy_grad takes NumPy arrays; for torch "
                        "use cross_entropy(...).backward()")
    from . import _np
    return _np.cross_entropy_grad(logits, labels, **kw)


def logprobs(logits, labels, *, temperature=1.0, entropy=False, **kw):
    """Per-token log p(label) (float32, labels' shape); entropy=True returns
    (logprob, entropy). Forward only, no [T, V] temporaries."""
    if _is_torch(logits):
        from . import _torch
        return _torch.logprobs(logits, labels, temperature=temperature,
                               entropy=entropy, **kw)
    from . import _np
    return _np.logprobs(logits, labels, temperature=temperature,
                        entropy=entropy, **kw)


def linear_cross_entropy(hidden, weight, labels, bias=None, **kw):
    """The LM head fused with the cross-entropy (torch CPU or CUDA tensors):
    loss of logits = hidden @ weight.T (+ bias) without the logits tensor;
    differentiable in hidden, weight and bias. See _linear.py for the
    keywords (ignore_index, reduction, normalizer, temperature, softcap,
    z_loss, label_smoothing, return_stats, chunk_rows; on the CPU also
    grad_accum, process_group, vocab_start, vocab_block: _linear_cpu.py)."""
    if _on_cpu(hidden):
        from . import _linear_cpu
        return _linear_cpu.linear_cross_entropy(hidden, weight, labels, bias,
                                                **kw)
    from . import _linear
    return _linear.linear_cross_entropy(hidden, weight, labels, bias, **kw)


def linear_logprobs(hidden, weight, labels, bias=None, **kw):
    """Per-token log p(label) (and the entropy with entropy=True, alias
    with_entropy) under logits = hidden @ weight.T (+ bias), differentiable
    in both outputs on CPU and CUDA tensors (the chunked head,
    xent/_linear_cpu.py; CUDA without a gradient: one fused call)."""
    if "with_entropy" in kw:                # the CUDA path's older name
        if "entropy" in kw:
            raise XentError("pass entropy= or with_entropy=, not both")
        kw["entropy"] = kw.pop("with_entropy")
    if _on_cpu(hidden):
        from . import _linear_cpu
        return _linear_cpu.linear_logprobs(hidden, weight, labels, bias, **kw)
    from . import _linear
    kw["with_entropy"] = kw.pop("entropy", False)
    return _linear.linear_logprobs(hidden, weight, labels, bias, **kw)


def _on_cpu(t):
    """A torch CPU tensor: the fused head's CPU path (xent/_linear_cpu.py)."""
    return _is_torch(t) and t.device.type == "cpu"


def __getattr__(name):
    if name == "CrossEntropyLoss":
        try:
            from ._torch import CrossEntropyLoss
        except ImportError as e:
            raise ImportError("xent.CrossEntropyLoss needs PyTorch (%s); the "
                              "NumPy API (xent.cross_entropy on ndarrays) "
                              "works without it" % e) from e
        return CrossEntropyLoss
    raise AttributeError("module 'xent' has no attribute %r" % name)
