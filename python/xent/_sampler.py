"""Processed log-probs: the distribution a sampler (vLLM's v1 sampler) draws
from after temperature, min-p, top-k and top-p (include/xent/sampler.h,
docs/sampler.md). NumPy arrays and torch CPU tensors; forward only."""
import collections
import ctypes
import sys

import numpy as np

from . import _capi as C
from ._capi import XentTypeError

# flags bits (include/xent/sampler.h)
MINP_NEAR, TOPP_NEAR, TOPP_TIE, TOPK_TIE, LABEL_AMBIGUOUS = 1, 2, 4, 8, 16
FLAG_NAMES = {MINP_NEAR: "minp_near", TOPP_NEAR: "topp_near",
              TOPP_TIE: "topp_tie", TOPK_TIE: "topk_tie",
              LABEL_AMBIGUOUS: "label_ambiguous"}


class SamplerOpts(ctypes.Structure):
    """xent_sampler_opts (include/xent/sampler.h), field for field."""
    _fields_ = [("temperature", C.c_dbl), ("top_k", C.c_i64),
                ("top_p", C.c_dbl), ("min_p", C.c_dbl),
                ("ignore_index", C.c_i64), ("boundary_tol", C.c_dbl),
                ("threads", C.c_int)]


class SamplerOutput(ctypes.Structure):
    """xent_sampler_output: ten pointers."""
    _fields_ = [(n, C.c_vp) for n in (
        "logprob", "logprob_full", "kept", "log_kept_mass", "entropy",
        "flags", "n_counted", "n_dropped", "n_ambiguous", "n_nonfinite")]


SamplerResult = collections.namedtuple("SamplerResult", [
    "logprob", "logprob_full", "kept", "log_kept_mass", "entropy", "flags",
    "n_counted", "n_dropped", "n_ambiguous", "n_nonfinite"])
SamplerResult.__doc__ = """Per-row arrays (the labels' shape):
logprob (float32: log q(label) under the processed distribution, -inf
outside the kept set, 0 on ignored rows), logprob_full (float32: log
softmax(z / temperature)(label)), kept (int64: size of the kept set),
log_kept_mass (float32, <= 0), entropy (float32, of the processed
distribution), flags (int32, xent._sampler.FLAG_NAMES); and the counts
n_counted, n_dropped (labels outside the kept set), n_ambiguous (rows whose
kept set is within rounding of another), n_nonfinite (ints)."""


def _opts(temperature, top_k, top_p, min_p, ignore_index, boundary_tol,
          threads):
    o = SamplerOpts()
    C.LIB.fn("xent_sampler_opts_init")(ctypes.addressof(o))
    o.temperature = C._float("temperature", temperature)
    o.top_k = C._int("top_k", top_k, 63)
    o.top_p = C._float("top_p", top_p)
    o.min_p = C._float("min_p", min_p)
    o.ignore_index = C._int("ignore_index", ignore_index, 63)
    o.boundary_tol = C._float("boundary_tol", boundary_tol)
    o.threads = C._int("threads", threads, 31)
    return o


def _from_torch(logits, labels):
    """torch CPU tensors as NumPy arrays over the same memory (bf16 as
    uint16 bits with dtype='bf16')."""
    torch = sys.modules["torch"]
    if logits.device.type != "cpu":
        raise XentTypeError("sampler_logprobs takes CPU tensors (got %s); "
                            "on CUDA call xent_cuda_sampler_logprobs (C API)"
                            % logits.device)
    if logits.requires_grad:
        logits = logits.detach()
    dtype = None
    if logits.dtype == torch.bfloat16:
        arr = logits.view(torch.int16).numpy().view(np.uint16)
        dtype = "bf16"
    elif logits.dtype in (torch.float32, torch.float16):
        arr = logits.numpy()
    else:
        raise XentTypeError("logits dtype %s is not supported (float32, "
                            "bfloat16, float16)" % logits.dtype)
    lab = labels
    if isinstance(labels, torch.Tensor):
        if labels.device.type != "cpu":
            raise XentTypeError("labels must be a CPU tensor")
        lab = labels.numpy()
    return arr, lab, dtype


def sampler_logprobs(logits, labels, temperature=1.0, top_k=0, top_p=1.0,
                     min_p=0.0, ignore_index=-100, *, boundary_tol=0.0,
                     threads=0, dtype=None):
    """Processed log-probs of labels under logits [..., V] (NumPy arrays or
    torch CPU tensors), with vLLM's v1 sampler rules: temperature, then
    min-p, then top-k (ties at the k-th value kept), then top-p (the
    smallest top set whose mass is >= top_p), renormalized over the kept
    set. Returns a SamplerResult of NumPy arrays (torch tensors for torch
    input). labels may be None (every row ignored). Forward only."""
    from . import _np
    is_torch = ("torch" in sys.modules and sys.modules["torch"] is not None
                and isinstance(logits, sys.modules["torch"].Tensor))
    if is_torch:
        logits, labels, tdt = _from_torch(logits, labels)
        dtype = dtype or tdt
    opts = _opts(temperature, top_k, top_p, min_p, ignore_index,
                 boundary_tol, threads)
    prep = _np.Prepared(logits, labels, dtype, need_labels=False)
    T = prep.T
    res = {"logprob": np.empty(T, np.float32),
           "logprob_full": np.empty(T, np.float32),
           "kept": np.empty(T, np.int64),
           "log_kept_mass": np.empty(T, np.float32),
           "entropy": np.empty(T, np.float32),
           "flags": np.empty(T, np.int32)}
    counts = {k: np.zeros(1, np.int64) for k in
              ("n_counted", "n_dropped", "n_ambiguous", "n_nonfinite")}
    out = SamplerOutput()
    for k, a in list(res.items()) + list(counts.items()):
        setattr(out, k, a.ctypes.data)
    C.LIB.call("xent_sampler_logprobs", ctypes.byref(prep.inp),
               ctypes.addressof(opts), ctypes.addressof(out))
    shape = prep.batch_shape
    res = {k: v.reshape(shape) for k, v in res.items()}
    if is_torch:
        torch = sys.modules["torch"]
        res = {k: torch.from_numpy(v) for k, v in res.items()}
    res.update({k: int(v[0]) for k, v in counts.items()})
    return SamplerResult(**res)


def flag_names(flags):
    """The names of the bits set in one flags value."""
    return [n for b, n in FLAG_NAMES.items() if int(flags) & b]


__all__ = ["sampler_logprobs", "SamplerResult", "flag_names"]
