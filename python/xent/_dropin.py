"""torch.nn.functional.cross_entropy's exact signature and meaning over
libxent (issue 51): `xent.nn.functional.cross_entropy` and
`xent.nn.CrossEntropyLoss`.

Two paths, chosen from static properties of the call (dtype, weight,
target kind), so that torch.compile sees no data-dependent branch:

* the kernel path: fp32 / bf16 / fp16 logits, class-index targets, no
  `weight`: the C kernel through the torch.library custom ops
  `xent::ce_fwd` / `xent::ce_bwd` (fake implementations registered, so
  torch.compile(fullgraph=True) and torch.export keep them in the graph).
  Rows holding a -inf logit (the masking idiom), which the kernel reports
  as non-finite, are recomputed inside the op in float64 with exp(-inf) = 0,
  so they match torch (a target at -inf gives +inf, an all -inf row NaN).
  Autograd: first order; a second derivative raises (the backward op has
  no derivative registered); forward-mode AD raises too. Eager calls that
  need a gradient of a scalar loss go through _FusedCE instead: the same
  kernel call writes the gradient in the forward (the speed of the C call;
  docs/python.md, "Speed of the Python call on the CPU").
* float64 logits on the CPU (class-index targets, no `weight`) take the
  same custom ops over the C kernel's float64 path, xent_ce_f64: the loss
  and the gradient are float64, each faithfully rounded (docs/numerics.md,
  "The float64 path"); -inf logits are exact zeros there, so no row is
  recomputed except NaN / +inf / all -inf rows (torch's formula, as above).
  Autograd: first order as above; a forward-mode dual input falls back to
  the composed path (which supports it).
* the composed path: `weight=`, probability targets, logits on another
  device (and float64 forward-mode AD): the loss is torch's own formula
  evaluated in float64 (torch ops, so autograd of any order works) and
  rounded once to the input's dtype. Outputs for fp32 / bf16 / fp16 inputs
  are then within one ulp of the exact value plus float64's own error
  (about V * 2^-52 relative of the largest term); for float64 inputs the
  result is float64 arithmetic, not faithfully rounded.

Torch's conventions are kept: a mean over zero counted rows (every target
ignored, or all weights zero) is NaN; the result has the input's dtype."""
import ctypes
from typing import Tuple

import torch
from torch.autograd.function import once_differentiable

from . import _capi as C
from ._capi import XentError
from . import _torch as T

_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16,
                  torch.float64)
_RED = {"none": 0, "sum": 1, "mean": 2}
_RED_NAME = {v: k for k, v in _RED.items()}


def _legacy_reduction(size_average, reduce, reduction):
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


# --- the custom ops (kernel path) ------------------------------------------


def _fix_rows_fwd(z, y, ignore_index, eps, rows):
    """float64 per-row loss of the rows `rows` (bool [T]) with torch's -inf
    semantics: (1 - eps) * nll + eps * (lse - mean z)."""
    zr = z[rows].double()
    yr = y[rows]
    lse = torch.logsumexp(zr, dim=-1)
    logp = torch.log_softmax(zr, dim=-1)    # torch's NaN where a +inf is
    ign = yr == ignore_index
    yt = yr.masked_fill(ign, 0)
    nll = -logp.gather(1, yt[:, None])[:, 0]
    loss = nll if eps == 0 else (1 - eps) * nll - eps * logp.mean(-1)
    return loss.masked_fill(ign, 0.0), lse


def _run_kernel_f64(z, y, ignore_index, reduction, eps, threads=0,
                    grad=None):
    """_run_kernel for float64 logits: one xent_ce_f64 call (float64 loss,
    faithfully rounded; -inf logits handled exactly)."""
    prep = T.Prepared(z, y, allow_f64=True)
    opts = C.make_opts(ignore_index=ignore_index, reduction=_RED_NAME[
        reduction], label_smoothing=eps, threads=threads)
    loss = prep.empty(prep.T if reduction == 0 else 1, dtype=torch.float64)
    stats = prep.empty(prep.T, C.STATS_DOUBLES, dtype=torch.float64)
    count, nonfin = T.call_f64(prep, opts, T.f64_out(loss=loss, stats=stats,
                                                     grad=grad))
    return (loss, stats, torch.tensor([count], dtype=torch.int64),
            nonfin)


def _run_kernel(z, y, ignore_index, reduction, eps, threads=0, grad=None):
    """One xent_ce call; grad: a dense [T, V] tensor of z's dtype that the
    same call fills with dL/dz for an upstream gradient of 1."""
    if z.dtype == torch.float64:
        return _run_kernel_f64(z, y, ignore_index, reduction, eps, threads,
                               grad)
    prep = T.Prepared(z, y)
    opts = C.make_opts(ignore_index=ignore_index, reduction=_RED_NAME[
        reduction], label_smoothing=eps, threads=threads)
    loss = prep.empty(prep.T if reduction == 0 else 1)
    stats = prep.empty(prep.T, C.STATS_DOUBLES, dtype=torch.float64)
    count = prep.empty(1, dtype=torch.int64)
    nonfin = prep.empty(1, dtype=torch.int64)
    out = T._out(loss, stats)
    out.n_counted = count.data_ptr()
    out.n_nonfinite = nonfin.data_ptr()
    if grad is not None:
        out.grad, out.grad_dtype, out.ld_grad = (grad.data_ptr(), prep.dtype,
                                                 prep.V)
    prep.backend.call("ce", ctypes.byref(prep.inp), ctypes.byref(opts),
                      ctypes.byref(out))
    return loss, stats, count, int(nonfin.item())


def _forward(z, y, ignore_index, reduction, eps, grad=None):
    """(loss, stats, exact_grad): the kernel call plus torch's conventions;
    exact_grad is False when `grad` does not hold torch's gradient (rows
    with a non-finite logit, a mean over zero rows): ce_bwd then computes
    it."""
    loss, stats, count, nonfin = _run_kernel(z, y, ignore_index, reduction,
                                             eps, grad=grad)
    exact_grad = grad is not None and not nonfin
    if nonfin:
        # rows with a NaN or infinite logit: torch's semantics in float64
        bad = torch.isnan(stats[:, 0])
        rl, lse = _fix_rows_fwd(z, y, ignore_index, eps, bad)
        stats[bad, 0] = lse
        stats[bad, 1] = float("nan")    # marks the row for ce_bwd
        if reduction == 0:
            loss[bad] = rl.to(loss.dtype)
        else:
            # the whole reduction again in float64 (rare path)
            counted = y != ignore_index
            rows, _ = _fix_rows_fwd(z, y, ignore_index, eps,
                                    torch.ones_like(counted))
            s = rows.sum()
            if reduction == 2:
                s = s / counted.sum()
            loss = s.to(loss.dtype).reshape(1)
    if reduction == 0:
        return loss, stats, exact_grad
    if reduction == 2 and int(count.item()) == 0:
        loss = torch.full((1,), float("nan"), dtype=loss.dtype,
                          device=z.device)           # torch: 0 / 0
        exact_grad = False
    return loss.reshape(()), stats, exact_grad


@torch.library.custom_op("xent::ce_fwd", mutates_args=())
def ce_fwd(z: torch.Tensor, y: torch.Tensor, ignore_index: int,
           reduction: int, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """z [T, V] (unit column stride), y [T] -> (loss: [T] for 'none', else
    [] float32 (float64 for float64 z); stats [T, 2] float64: lse, nll, with
    rows recomputed where the kernel saw a non-finite logit)."""
    loss, stats, _ = _forward(z, y, ignore_index, reduction, eps)
    return loss, stats


@ce_fwd.register_fake
def _(z, y, ignore_index, reduction, eps):
    T_ = z.shape[0]
    loss = z.new_empty((T_,) if reduction == 0 else (),
                       dtype=torch.float64 if z.dtype == torch.float64
                       else torch.float32)
    return loss, z.new_empty((T_, 2), dtype=torch.float64)


@torch.library.custom_op("xent::ce_bwd", mutates_args=())
def ce_bwd(g: torch.Tensor, z: torch.Tensor, y: torch.Tensor,
           stats: torch.Tensor, ignore_index: int, reduction: int,
           eps: float) -> torch.Tensor:
    """dL/dz [T, V] in z's dtype, from the upstream g ([T] or [])."""
    if z.dtype == torch.float64:
        return _bwd_f64(g, z, y, stats, ignore_index, reduction, eps)
    prep = T.Prepared(z, y)
    opts = C.make_opts(ignore_index=ignore_index, reduction=_RED_NAME[
        reduction], label_smoothing=eps)
    rows = None
    counted = int((y != ignore_index).sum())
    if reduction == 0:
        rows = g.reshape(-1).to(torch.float32).contiguous()
        prep.inp.grad_rows = rows.data_ptr()
    else:
        opts.grad_scale = float(g.item())
    grad = T.empty_rows((prep.T, prep.V), z.dtype, z.device)
    st = stats.contiguous()
    bad = torch.isnan(st[:, 1])             # rows ce_fwd recomputed
    if reduction == 2 and counted == 0:
        return torch.zeros_like(grad)     # torch: NaN loss, zero gradient
    prep.backend.call("ce_backward", ctypes.byref(prep.inp),
                      ctypes.byref(opts), ctypes.c_void_p(st.data_ptr()),
                      ctypes.c_void_p(grad.data_ptr()),
                      ctypes.c_int(prep.dtype), ctypes.c_int64(prep.V))
    del rows
    return _fix_rows_bwd(grad, g, z, y, bad, ignore_index, reduction, eps,
                         counted)


def _fix_rows_bwd(grad, g, z, y, bad, ignore_index, reduction, eps,
                  counted):
    """grad with the rows `bad` (bool [T]: a non-finite logit) replaced by
    torch's gradient, computed in float64."""
    if bool(bad.any()):
        # torch's gradient of the rows with a non-finite logit, in float64
        zr = z[bad].double()
        p = torch.softmax(zr, dim=-1)
        yr = y[bad]
        ign = yr == ignore_index
        onehot = torch.zeros_like(p).scatter_(
            1, yr.masked_fill(ign, 0)[:, None], 1.0)
        q = (1 - eps) * onehot + eps / zr.shape[1]
        gr = p - q
        if reduction == 0:
            a = g.reshape(-1)[bad].double()
        else:
            a = g.double().expand(int(bad.sum()))
            if reduction == 2:
                a = a / counted
        gr = (gr * a[:, None]).masked_fill(ign[:, None], 0.0)
        grad[bad] = gr.to(z.dtype)
    return grad


def _bwd_f64(g, z, y, stats, ignore_index, reduction, eps):
    """ce_bwd for float64 z: xent_ce_f64 recomputes each row from the
    logits and writes the float64 gradient, faithfully rounded (the saved
    stats only mark the NaN / +inf / all -inf rows, which get torch's
    gradient)."""
    prep = T.Prepared(z, y, allow_f64=True)
    opts = C.make_opts(ignore_index=ignore_index, reduction=_RED_NAME[
        reduction], label_smoothing=eps)
    counted = int((y != ignore_index).sum())
    rows = None
    if reduction == 0:
        rows = g.reshape(-1)
    else:
        opts.grad_scale = float(g.item())
    grad = T.empty_rows((prep.T, prep.V), z.dtype, z.device)
    bad = torch.isnan(stats[:, 1])
    if reduction == 2 and counted == 0:
        return torch.zeros_like(grad)     # torch: NaN loss, zero gradient
    T.call_f64(prep, opts, T.f64_out(grad=grad), grad_rows=rows)
    return _fix_rows_bwd(grad, g, z, y, bad, ignore_index, reduction, eps,
                         counted)


@ce_bwd.register_fake
def _(g, z, y, stats, ignore_index, reduction, eps):
    return torch.empty_like(z, memory_format=torch.contiguous_format)


def _setup_ctx(ctx, inputs, output):
    z, y, ignore_index, reduction, eps = inputs
    ctx.save_for_backward(z, y, output[1])
    ctx.args = (ignore_index, reduction, eps)


def _backward(ctx, g_loss, g_stats):
    z, y, stats = ctx.saved_tensors
    return (ce_bwd(g_loss, z, y, stats, *ctx.args), None, None, None, None)


torch.library.register_autograd("xent::ce_fwd", _backward,
                                setup_context=_setup_ctx)


class _FusedCE(torch.autograd.Function):
    """Eager (not compiled) CPU calls whose logits need a gradient and whose
    loss is a scalar: the forward's kernel call writes the gradient too (one
    pass over the logits, the speed of the C call xent_ce; see
    xent._torch.FUSED_BACKWARD). The backward hands it over when the
    upstream gradient is exactly 1, else computes it as ce_bwd does. The
    result is the same op as ce_fwd's, bit for bit."""

    @staticmethod
    def forward(ctx, z, y, ignore_index, reduction, eps):
        grad = T.empty_rows(tuple(z.shape), z.dtype, z.device)
        loss, stats, exact = _forward(z, y, ignore_index, reduction, eps,
                                      grad=grad)
        ctx.save_for_backward(z, y, stats)
        ctx.args = (ignore_index, reduction, eps)
        ctx.pre = grad if exact else None
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        pre = T.take_fused_grad(ctx, g)
        if pre is None:
            z, y, stats = ctx.saved_tensors
            pre = ce_bwd(g, z, y, stats, *ctx.args)
        return pre, None, None, None, None


# --- layout ---------------------------------------------------------------


def _class_last_2d(input):
    """[C] / [N, C] / [N, C, d1, ...] -> ([T, C] with unit column stride,
    the batch shape of the per-element loss)."""
    if input.dim() == 1:
        return input.unsqueeze(0), ()
    if input.dim() == 2:
        x = input
        if x.stride(1) != 1 and x.shape[1] > 1:
            x = x.contiguous()
        return x, (input.shape[0],)
    # [N, C, d...]: the kernel reads rows of unit column stride, so the
    # class dimension is moved last with a copy (C change: a column stride)
    x = input.movedim(1, -1)
    batch = tuple(x.shape[:-1])
    return x.reshape(-1, input.shape[1]), batch


def _target_flat(target, batch):
    if target.dim() == 0 and batch == ():
        return target.reshape(1)
    return target.reshape(-1)


# --- the composed path ----------------------------------------------------


def _composed(input, target, weight, ignore_index, reduction, eps):
    """torch's formula (aten LossNLL.cpp, cross_entropy with label
    smoothing) in float64, rounded once to the input's dtype."""
    dt = input.dtype
    z2, batch = _class_last_2d(input)
    Cn = z2.shape[1]
    logp = torch.log_softmax(z2.double(), dim=-1)
    w = None if weight is None else weight.double()
    if target.is_floating_point():          # probabilities [.., C, ..]
        q = _class_last_2d(target)[0].double()
        if eps > 0:
            q = q * (1 - eps) + eps / Cn
        t = -logp * q if w is None else -(logp * w) * q
        rows = t.sum(-1)
        if reduction == "none":
            return rows.reshape(batch).to(dt)
        s = rows.sum()
        if reduction == "mean":
            s = s / rows.shape[0]           # torch: over the N * d1... rows
        return s.to(dt)
    y = _target_flat(target, batch)
    ign = y == ignore_index
    yt = y.masked_fill(ign, 0)
    wt = (torch.ones_like(logp[:, 0]) if w is None else w[yt])
    wt = wt.masked_fill(ign, 0.0)
    nll = -logp.gather(1, yt[:, None])[:, 0] * wt
    nll = nll.masked_fill(ign, 0.0)
    if eps > 0:
        smooth = -(logp if w is None else logp * w).sum(-1)
        smooth = smooth.masked_fill(ign, 0.0)
    if reduction == "none":
        out = nll if eps == 0 else (1 - eps) * nll + smooth * (eps / Cn)
        return out.reshape(batch).to(dt)
    if reduction == "sum":
        out = nll.sum()
        if eps > 0:
            out = (1 - eps) * out + smooth.sum() * (eps / Cn)
        return out.to(dt)
    den = wt.sum()                          # 0 -> NaN, as torch
    out = nll.sum() / den
    if eps > 0:
        out = (1 - eps) * out + (smooth.sum() / den) * (eps / Cn)
    return out.to(dt)


# --- the public functions --------------------------------------------------


def cross_entropy(input, target, weight=None, size_average=None,
                  ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    """torch.nn.functional.cross_entropy, argument for argument."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if reduction not in _RED:
        raise ValueError("%s is not a valid value for reduction" % reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError("label_smoothing must be between 0.0 and 1.0. Got: "
                         "%s" % label_smoothing)
    if input.dim() == 0:
        raise ValueError("input must have a class dimension ([C], [N, C] or "
                         "[N, C, d1, ...])")
    if (weight is not None or target.is_floating_point()
            or input.dtype not in _KERNEL_DTYPES
            or input.device.type != "cpu"):
        return _composed(input, target, weight, ignore_index, reduction,
                         float(label_smoothing))
    if target.dtype not in (torch.int64, torch.int32):
        raise XentError("target dtype %s: class indices must be int64 (or "
                        "int32)" % target.dtype)
    if not torch.compiler.is_compiling():
        import torch.autograd.forward_ad as fwAD
        if fwAD.unpack_dual(input).tangent is not None:
            if input.dtype == torch.float64:    # forward-mode AD: the composed form
                return _composed(input, target, weight, ignore_index,
                                 reduction, float(label_smoothing))
            raise RuntimeError(
                "xent cross_entropy: forward-mode AD is not supported on the "
                "kernel path (fp32/bf16/fp16 logits, class targets, no "
                "weight); use reverse mode, or float64 logits (the composed "
                "path, which supports it)")
    z2, batch = _class_last_2d(input)
    y = _target_flat(target, batch)
    if y.shape[0] != z2.shape[0]:
        raise ValueError("Expected input batch_size (%d) to match target "
                         "batch_size (%d)." % (z2.shape[0], y.shape[0]))
    y = y.contiguous()
    if (T.FUSED_BACKWARD and reduction != "none" and z2.requires_grad
            and torch.is_grad_enabled() and z2.numel()
            and not torch.compiler.is_compiling()):
        loss = _FusedCE.apply(z2, y, int(ignore_index), _RED[reduction],
                              float(label_smoothing))
    else:
        loss, _ = torch.ops.xent.ce_fwd(z2, y, int(ignore_index),
                                        _RED[reduction],
                                        float(label_smoothing))
    if reduction == "none":
        loss = loss.reshape(batch)
    return loss.to(input.dtype)


class CrossEntropyLoss(torch.nn.Module):
    """torch.nn.CrossEntropyLoss, argument for argument (class dimension 1,
    as torch)."""

    __constants__ = ["ignore_index", "reduction", "label_smoothing"]

    def __init__(self, weight=None, size_average=None, ignore_index=-100,
                 reduce=None, reduction="mean", label_smoothing=0.0):
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = _legacy_reduction(size_average, reduce, reduction)
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        return cross_entropy(input, target, weight=self.weight,
                             ignore_index=self.ignore_index,
                             reduction=self.reduction,
                             label_smoothing=self.label_smoothing)
