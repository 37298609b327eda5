"""The LM head fused with the cross-entropy, for torch CUDA tensors: an
autograd Function over xent_cuda_linear_ce / xent_cuda_linear_backward and
the forward-only xent_cuda_linear_logprobs (include/xent/cuda.h).

logits = hidden @ weight^T (+ bias) are computed in chunks of rows with fp32
accumulation inside the library and never exist whole; the memory a call
needs besides its inputs and gradients is its workspace, allocated here with
torch.empty(uint8) on the device (so torch's caching allocator accounts for
it) at the size xent_cuda_linear_workspace reports.

Gradients:
  - reduction 'mean' / 'sum': the forward computes the loss and the
    gradients of hidden, weight and bias (those that require grad) in the
    same call and keeps them; the backward multiplies them in place by the
    upstream gradient g. There is no host synchronization: the product is
    always done on the device (one pass over the gradients); when g == 1,
    x * 1 == x exactly in every float format, so the result is bitwise the
    library's. For g != 1 it adds one rounding to the gradients' dtype. The
    kept gradients are handed to autograd (no copy) and then dropped, so a
    second backward through the same graph raises.
  - reduction 'none': the forward writes per-row losses and keeps the
    per-row stats (16 bytes a row); the backward recomputes the logits and
    calls xent_cuda_linear_backward with grad_rows = g. Labels were checked
    by the forward, so the backward runs with the label check off (no
    synchronization).

What the one-call path lacks goes to the chunked head (xent/_linear_cpu.py,
the CPU head's algorithm with the CUDA kernels xent_cuda_ce_shard_stats /
_combine / _backward and torch.mm on the device): grad_accum ("main_grad" /
"fp32_grad": the weight gradient added in place into an fp32 buffer),
process_group / vocab_start / vocab_total / vocab_block (vocabulary
parallel), and a linear_logprobs whose inputs need a gradient
(differentiable log-probs and entropy, temperature and softcap included).
The argument checks are the chunked head's (check_inputs, one place).
"""
import ctypes

import torch

from . import _capi as C
from . import _linear_cpu as _chunked
from ._capi import XentError, XentTypeError
from ._torch import CudaBackend, _DTYPES, _p

_DEVICE_TYPE = "cuda"       # the device type every tensor must be on


def available():
    """True when libxent has the fused LM head with CUDA and torch sees a
    GPU."""
    if not torch.cuda.is_available():
        return False
    try:
        return (C.LIB.has("xent_cuda_linear_ce")
                and "cuda" in C.version())
    except XentError:
        return False


class _Prepared:
    """An xent_linear_input over torch tensors (the row-major copies or views
    it points at are kept alive here)."""

    def __init__(self, fn, hidden, weight, bias, labels, need_labels=True):
        self.batch_shape, H, V = _chunked.check_inputs(
            fn, hidden, weight, bias, labels, _DEVICE_TYPE, same_dtype=True)
        if not available():
            raise XentTypeError("%s: this build of libxent (%s) has no CUDA "
                                "fused LM head (xent_cuda_linear_ce), or "
                                "torch sees no GPU" % (fn, C.version()))
        dt = _DTYPES[hidden.dtype]
        self.device, self.fn = hidden.device, fn
        self.torch_dtype = hidden.dtype
        self.hidden = hidden.reshape(-1, H).contiguous()     # [T, H]
        self.weight = weight.contiguous()
        self.bias = None if bias is None else bias.contiguous()
        self.T, self.H, self.V = int(self.hidden.shape[0]), H, V
        self.backend = CudaBackend(self.device)
        self.inp = C.LinearInput()
        self.inp.hidden = self.hidden.data_ptr()
        self.inp.weight = self.weight.data_ptr()
        self.inp.bias = _p(self.bias)
        self.inp.dtype = dt
        self.inp.T, self.inp.H, self.inp.V = self.T, H, V
        self.labels = None
        if labels is not None or need_labels:
            self.set_labels(labels)

    def set_labels(self, labels):
        self.labels = _chunked.check_labels(self.fn, labels,
                                            self.batch_shape)     # [T]
        self.inp.labels = self.labels.data_ptr()
        self.inp.label_dtype = (C.I32 if labels.dtype == torch.int32
                                else C.I64)

    def empty(self, *shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device=self.device)

    def grads(self, want_h, want_w, want_b):
        """Fresh gradient tensors (inputs' dtypes) and the xent_linear_grads
        over them; (None, None) when none is wanted."""
        hidden = torch.empty_like(self.hidden) if want_h else None
        weight = torch.empty_like(self.weight) if want_w else None
        bias = (torch.empty_like(self.bias)
                if want_b and self.bias is not None else None)
        if hidden is None and weight is None and bias is None:
            return None, None
        g = C.LinearGrads()
        g.hidden, g.weight, g.bias = _p(hidden), _p(weight), _p(bias)
        g.hidden_dtype = g.weight_dtype = g.bias_dtype = self.inp.dtype
        g.accumulate = 0
        return g, (hidden, weight, bias)

    def workspace(self, grads, chunk_rows):
        """A uint8 device tensor of the size the library asks for."""
        n = C.LIB.fn("xent_cuda_linear_workspace")(
            ctypes.byref(self.inp),
            None if grads is None else ctypes.byref(grads),
            ctypes.c_int64(chunk_rows))
        if n == ctypes.c_size_t(-1).value or n >= 1 << 62:
            raise XentError("%s: xent_cuda_linear_workspace failed: %s"
                            % (self.fn, C.LIB.fn("xent_last_error")()
                               .decode("utf-8", "replace")), C.ERR_VALUE)
        if n == 0:          # nothing to hold: NULL, 0 bytes
            return None, 0
        return torch.empty(int(n), dtype=torch.uint8, device=self.device), \
            int(n)

    def call_unchecked(self, name, *args):
        """A call with the label check off (labels already checked; the
        setting is per thread)."""
        check = C.LIB.fn("xent_cuda_set_label_check")
        prev = check(0)
        try:
            self.backend.call(name, *args)
        finally:
            check(prev)


class _Config:
    def __init__(self, reduction, opts, chunk_rows, return_stats, want):
        self.reduction, self.opts = reduction, opts
        self.chunk_rows, self.return_stats = chunk_rows, return_stats
        self.want = want            # (hidden, weight, bias) need a gradient


FN = "xent.linear_cross_entropy"


class _LinearCrossEntropy(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, cfg):
        prep = _Prepared(FN, hidden, weight, bias, labels)
        opts = C.make_opts(**cfg.opts)
        none = cfg.reduction == "none"
        loss = prep.empty(prep.T if none else 1)
        out = C.CeOutput()
        out.loss = loss.data_ptr()
        stats = None
        if none:                                    # kept for the backward
            stats = prep.empty(prep.T, C.STATS_DOUBLES, dtype=torch.float64)
            out.stats = stats.data_ptr()
        extra = ()
        if cfg.return_stats:
            lse = prep.empty(prep.T)
            counts = prep.empty(2, dtype=torch.int64)
            out.lse = lse.data_ptr()
            out.n_counted = counts.data_ptr()
            out.n_nonfinite = counts.data_ptr() + 8
            extra = (lse.view(prep.batch_shape), counts[0], counts[1])
            ctx.mark_non_differentiable(*extra)
        grads, bufs = (None, None) if none else prep.grads(*cfg.want)
        ws, nbytes = prep.workspace(grads, cfg.chunk_rows)
        prep.backend.call("linear_ce", ctypes.byref(prep.inp),
                          ctypes.byref(opts), ctypes.byref(out),
                          None if grads is None else ctypes.byref(grads),
                          ctypes.c_void_p(_p(ws)),
                          ctypes.c_size_t(nbytes))
        del ws
        ctx.cfg = cfg
        ctx.hshape = tuple(hidden.shape)
        if none:
            ctx.save_for_backward(prep.hidden, prep.weight, prep.bias,
                                  prep.labels, stats)
            ctx.bufs = None
        else:
            ctx.bufs = bufs
        ctx.used = False
        loss = loss.view(prep.batch_shape) if none else loss.view(())
        return (loss,) + extra if cfg.return_stats else loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g, *unused):
        cfg = ctx.cfg
        if ctx.used:
            raise XentError("%s: a second backward through the same call is "
                            "not supported (its gradients were computed "
                            "once and handed over)" % FN, C.ERR_VALUE)
        ctx.used = True
        if cfg.reduction != "none":
            bufs, ctx.bufs = ctx.bufs, None
            if bufs is None:
                return None, None, None, None, None
            gh, gw, gb = bufs
            del bufs
            g = g.reshape(()).to(torch.float32)
            for t in (gh, gw, gb):
                if t is not None:
                    t.mul_(g)            # on the device; exact when g == 1
            if gh is not None:
                gh = gh.view(ctx.hshape)
            return gh, gw, gb, None, None
        hidden, weight, bias, labels, stats = ctx.saved_tensors
        want = ctx.needs_input_grad[:3]
        if not any(want):
            return None, None, None, None, None
        prep = _Prepared(FN, hidden, weight, bias, None, need_labels=False)
        prep.labels = labels
        prep.inp.labels = labels.data_ptr()
        prep.inp.label_dtype = (C.I32 if labels.dtype == torch.int32
                                else C.I64)
        opts = C.make_opts(**cfg.opts)
        rows = g.reshape(-1).to(torch.float32).contiguous()        # [T]
        prep.inp.grad_rows = rows.data_ptr()
        grads, bufs = prep.grads(*want)
        ws, nbytes = prep.workspace(grads, cfg.chunk_rows)
        prep.call_unchecked("linear_backward", ctypes.byref(prep.inp),
                            ctypes.byref(opts),
                            ctypes.c_void_p(stats.data_ptr()),
                            ctypes.byref(grads),
                            ctypes.c_void_p(_p(ws)),
                            ctypes.c_size_t(nbytes))
        del ws, rows
        gh, gw, gb = bufs
        if gh is not None:
            gh = gh.view(ctx.hshape)
        return gh, gw, gb, None, None


def _needs_cuda(fn, hidden):
    if not isinstance(hidden, torch.Tensor):
        raise XentTypeError("%s: hidden must be a torch.Tensor, got %s"
                            % (fn, type(hidden).__name__))
    if hidden.device.type != _DEVICE_TYPE:
        raise XentTypeError("%s needs CUDA tensors (hidden is on %s)"
                            % (fn, hidden.device))


def _sharded(process_group, vocab_start, vocab_total, vocab_block, weight):
    return (process_group is not None or vocab_block is not None
            or vocab_start not in (0, None)
            or (vocab_total not in (None, 0) and isinstance(weight,
                                                            torch.Tensor)
                and int(vocab_total) != int(weight.shape[0])))


def _grad_wanted(*ts):
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in ts)


def linear_cross_entropy(hidden, weight, labels, bias=None, *,
                         ignore_index=-100, reduction="mean", normalizer=None,
                         temperature=1.0, softcap=0.0, z_loss=0.0,
                         label_smoothing=0.0, return_stats=False,
                         chunk_rows=0, grad_accum=None, process_group=None,
                         vocab_start=0, vocab_total=None, vocab_block=None,
                         threads=0):
    """Cross-entropy of logits = hidden @ weight.T (+ bias) against labels,
    without the logits tensor. hidden [..., H], weight [V, H], bias [V]
    (same dtype: float32, bfloat16 or float16), labels [...] int64/int32,
    all on one CUDA device; runs on torch's current stream.

    Returns the loss (float32: [...] for reduction 'none', else a scalar);
    with return_stats=True, (loss, info) where info holds 'lse' ([...]
    float32 log-sum-exp of each row's transformed logits), 'n_counted' and
    'n_nonfinite' (int64 0-d device tensors). chunk_rows: rows per chunk
    (0: the library's default, about 768 MiB of chunk buffers).
    Differentiable in hidden, weight and bias (see the module docstring for
    how the gradients are computed).

    grad_accum ('main_grad' / 'fp32_grad'), process_group, vocab_start,
    vocab_total, vocab_block: the chunked head (xent/_linear_cpu.py) with
    the CUDA kernels, as on the CPU."""
    _needs_cuda(FN, hidden)
    _chunked.check_reduction(FN, reduction)
    if grad_accum is not None or _sharded(process_group, vocab_start,
                                          vocab_total, vocab_block, weight):
        return _chunked.linear_cross_entropy(
            hidden, weight, labels, bias, ignore_index=ignore_index,
            reduction=reduction, normalizer=normalizer,
            temperature=temperature, softcap=softcap, z_loss=z_loss,
            label_smoothing=label_smoothing, return_stats=return_stats,
            chunk_rows=chunk_rows, grad_accum=grad_accum,
            process_group=process_group, vocab_start=vocab_start,
            vocab_total=vocab_total, vocab_block=vocab_block,
            threads=threads, _device_type=_DEVICE_TYPE)
    opts = dict(ignore_index=ignore_index, reduction=reduction,
                normalizer=normalizer, temperature=temperature,
                softcap=softcap, z_loss=z_loss,
                label_smoothing=label_smoothing)
    C.make_opts(**opts)            # early check of the option values' types
    chunk_rows = _chunked.check_chunk_rows(FN, chunk_rows)
    grad_on = torch.is_grad_enabled()
    want = tuple(bool(grad_on and isinstance(t, torch.Tensor)
                      and t.requires_grad) for t in (hidden, weight, bias))
    cfg = _Config(reduction, opts, chunk_rows, bool(return_stats), want)
    res = _LinearCrossEntropy.apply(hidden, weight, bias, labels, cfg)
    if not return_stats:
        return res
    loss, lse, n_counted, n_nonfinite = res
    return loss, dict(lse=lse, n_counted=n_counted, n_nonfinite=n_nonfinite)


def linear_logprobs(hidden, weight, labels, bias=None, *, temperature=1.0,
                    softcap=0.0, with_entropy=False, ignore_index=-100,
                    chunk_rows=0, entropy=None, grad_accum=None,
                    process_group=None, vocab_start=0, vocab_total=None,
                    vocab_block=None, threads=0):
    """Per-token log p(label) under logits = hidden @ weight.T (+ bias)
    (float32, labels' shape; 0 on rows whose label is ignore_index) and,
    with with_entropy=True (or entropy=True), (logprob, entropy). No
    [T, V] tensor.

    When hidden, weight or bias needs a gradient (and grad mode is on), or
    with grad_accum / process_group / vocab_*: the chunked head with the
    CUDA kernels, differentiable in both outputs (the entropy's gradient
    in float64, temperature and softcap included). Otherwise one forward
    call (xent_cuda_linear_logprobs), no autograd graph."""
    fn = "xent.linear_logprobs"
    _needs_cuda(fn, hidden)
    if entropy is not None:
        with_entropy = bool(entropy) or bool(with_entropy)
    if grad_accum is not None or _grad_wanted(hidden, weight, bias) or \
            _sharded(process_group, vocab_start, vocab_total, vocab_block,
                     weight):
        return _chunked.linear_logprobs(
            hidden, weight, labels, bias, temperature=temperature,
            softcap=softcap, entropy=with_entropy, ignore_index=ignore_index,
            chunk_rows=chunk_rows, grad_accum=grad_accum,
            process_group=process_group, vocab_start=vocab_start,
            vocab_total=vocab_total, vocab_block=vocab_block,
            threads=threads, _device_type=_DEVICE_TYPE)
    hidden = hidden.detach()
    weight = weight.detach() if isinstance(weight, torch.Tensor) else weight
    if isinstance(bias, torch.Tensor):
        bias = bias.detach()
    opts = C.make_opts(ignore_index=ignore_index, reduction="none",
                       temperature=temperature, softcap=softcap)
    chunk_rows = _chunked.check_chunk_rows(fn, chunk_rows)
    prep = _Prepared(fn, hidden, weight, bias, labels)
    lp = prep.empty(prep.T)
    ent = prep.empty(prep.T) if with_entropy else None
    ws, nbytes = prep.workspace(None, chunk_rows)
    prep.backend.call("linear_logprobs", ctypes.byref(prep.inp),
                      ctypes.byref(opts), ctypes.c_void_p(lp.data_ptr()),
                      ctypes.c_void_p(_p(ent)),
                      ctypes.c_void_p(_p(ws)),
                      ctypes.c_size_t(nbytes))
    del ws
    lp = lp.view(prep.batch_shape)
    return (lp, ent.view(prep.batch_shape)) if with_entropy else lp
