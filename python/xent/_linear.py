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
"""
import ctypes

import torch

from . import _capi as C
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
        names = (("hidden", hidden), ("weight", weight), ("bias", bias),
                 ("labels", labels))
        for name, t in names:
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise XentTypeError("%s: %s must be a torch.Tensor, got %s"
                                    % (fn, name, type(t).__name__))
            if t.device.type != _DEVICE_TYPE:
                raise XentTypeError("%s needs CUDA tensors (%s is on %s)"
                                    % (fn, name, t.device))
        dev = hidden.device
        for name, t in names[1:]:
            if t is not None and t.device != dev:
                raise XentTypeError("%s: %s is on %s but hidden on %s"
                                    % (fn, name, t.device, dev))
        if not available():
            raise XentTypeError("%s: this build of libxent (%s) has no CUDA "
                                "fused LM head (xent_cuda_linear_ce), or "
                                "torch sees no GPU" % (fn, C.version()))
        dt = _DTYPES.get(hidden.dtype)
        if dt is None:
            raise XentTypeError("%s: hidden dtype %s is not supported "
                                "(float32, bfloat16, float16)"
                                % (fn, hidden.dtype))
        for name, t in (("weight", weight), ("bias", bias)):
            if t is not None and t.dtype != hidden.dtype:
                raise XentTypeError("%s: %s dtype %s differs from hidden "
                                    "dtype %s (they must be the same)"
                                    % (fn, name, t.dtype, hidden.dtype))
        if hidden.dim() < 1 or weight.dim() != 2:
            raise XentError("%s: hidden must be [..., H] and weight [V, H]; "
                            "got hidden %s, weight %s"
                            % (fn, tuple(hidden.shape), tuple(weight.shape)),
                            C.ERR_SHAPE)
        H = int(hidden.shape[-1])
        V = int(weight.shape[0])
        if int(weight.shape[1]) != H:
            raise XentError("%s: weight shape %s does not match hidden's H = "
                            "%d (weight is [V, H])"
                            % (fn, tuple(weight.shape), H), C.ERR_SHAPE)
        if bias is not None and tuple(bias.shape) != (V,):
            raise XentError("%s: bias shape %s must be [V] = (%d,)"
                            % (fn, tuple(bias.shape), V), C.ERR_SHAPE)
        self.batch_shape = tuple(hidden.shape[:-1])
        self.device, self.fn = dev, fn
        self.torch_dtype = hidden.dtype
        self.hidden = hidden.reshape(-1, H).contiguous()     # [T, H]
        self.weight = weight.contiguous()
        self.bias = None if bias is None else bias.contiguous()
        self.T, self.H, self.V = int(self.hidden.shape[0]), H, V
        self.backend = CudaBackend(dev)
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
        fn = self.fn
        if not isinstance(labels, torch.Tensor):
            raise XentTypeError("%s: labels must be a torch.Tensor, got %s"
                                % (fn, type(labels).__name__))
        if labels.dtype not in (torch.int64, torch.int32):
            raise XentTypeError("%s: labels dtype %s is not supported: use "
                                "torch.long (or torch.int32)"
                                % (fn, labels.dtype))
        if tuple(labels.shape) != self.batch_shape:
            raise XentError("%s: labels shape %s does not match hidden's "
                            "leading shape %s (hidden [..., H], labels [...])"
                            % (fn, tuple(labels.shape), self.batch_shape),
                            C.ERR_SHAPE)
        self.labels = labels.reshape(-1).contiguous()        # [T]
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


def linear_cross_entropy(hidden, weight, labels, bias=None, *,
                         ignore_index=-100, reduction="mean", normalizer=None,
                         temperature=1.0, softcap=0.0, z_loss=0.0,
                         label_smoothing=0.0, return_stats=False,
                         chunk_rows=0):
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
    how the gradients are computed)."""
    if reduction not in C.REDUCTIONS:
        raise XentError("%s: reduction = %r: must be one of 'none', 'sum', "
                        "'mean'" % (FN, reduction), C.ERR_VALUE)
    opts = dict(ignore_index=ignore_index, reduction=reduction,
                normalizer=normalizer, temperature=temperature,
                softcap=softcap, z_loss=z_loss,
                label_smoothing=label_smoothing)
    C.make_opts(**opts)            # early check of the option values' types
    chunk_rows = C._int("chunk_rows", chunk_rows, 62)
    if chunk_rows < 0:
        raise XentError("%s: chunk_rows = %d must be >= 0 (0: default)"
                        % (FN, chunk_rows), C.ERR_VALUE)
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
                    chunk_rows=0):
    """Per-token log p(label) under logits = hidden @ weight.T (+ bias)
    (float32, labels' shape; 0 on rows whose label is ignore_index) and,
    with with_entropy=True, (logprob, entropy). Forward only (no autograd
    graph), no [T, V] tensor."""
    fn = "xent.linear_logprobs"
    hidden = hidden.detach() if isinstance(hidden, torch.Tensor) else hidden
    weight = weight.detach() if isinstance(weight, torch.Tensor) else weight
    if isinstance(bias, torch.Tensor):
        bias = bias.detach()
    opts = C.make_opts(ignore_index=ignore_index, reduction="none",
                       temperature=temperature, softcap=softcap)
    chunk_rows = C._int("chunk_rows", chunk_rows, 62)
    if chunk_rows < 0:
        raise XentError("%s: chunk_rows = %d must be >= 0 (0: default)"
                        % (fn, chunk_rows), C.ERR_VALUE)
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
