"""NumPy front end: cross-entropy, its gradient and log-probs on ndarrays."""
import ctypes

import numpy as np

from . import _capi as C
from ._capi import XentError, XentTypeError

_NP_DTYPES = {"float32": C.F32, "float16": C.F16, "bfloat16": C.BF16}
_KW_DTYPES = {"bf16": C.BF16, "bfloat16": C.BF16, "f16": C.F16,
              "fp16": C.F16, "float16": C.F16, "f32": C.F32,
              "fp32": C.F32, "float32": C.F32}


def _logits_dtype(a, dtype):
    """The xent dtype of a logits array (dtype= names the format of a uint16
    bit-pattern array)."""
    name = a.dtype.name
    if dtype is not None:
        want = _KW_DTYPES.get(str(dtype).lower())
        if want is None:
            raise XentTypeError("dtype = %r: must be 'bf16', 'f16' or 'f32'"
                                % (dtype,))
        bits = {C.F32: ("float32",), C.BF16: ("uint16", "bfloat16"),
                C.F16: ("uint16", "float16")}[want]
        if name not in bits:
            raise XentTypeError("logits of numpy dtype %s cannot be read as "
                                "%s (expected %s)" % (name, dtype,
                                                      " or ".join(bits)))
        return want
    if name in _NP_DTYPES:
        return _NP_DTYPES[name]
    if name == "uint16":
        raise XentTypeError("uint16 logits: say which format the bits hold "
                            "with dtype='bf16' or dtype='f16'")
    raise XentTypeError("logits dtype %s is not supported (float32, float16, "
                        "bfloat16 [ml_dtypes], or uint16 bits with "
                        "dtype='bf16'); for float64 pass "
                        "logits.astype(np.float32)" % name)


def row_layout(shape, strides, itemsize, what="logits"):
    """(T, V, ld) of a [..., V] array whose rows are evenly strided with
    unit column stride; raises with a how-to-fix message otherwise."""
    if len(shape) < 2:
        raise XentError("%s must have shape [..., V] with at least 2 "
                        "dimensions, got shape %s" % (what, tuple(shape)),
                        C.ERR_SHAPE)
    V = int(shape[-1])
    T = 1
    for s in shape[:-1]:
        T *= int(s)
    fix = ("%s are not laid out as evenly strided rows of contiguous "
           "elements (shape %s, strides %s bytes); make them contiguous "
           "first (np.ascontiguousarray(x) / x.contiguous())"
           % (what, tuple(shape), tuple(strides)))
    if T == 0 or V == 0:
        return T, V, V
    if V > 1 and strides[-1] != itemsize:
        raise XentError(fix, C.ERR_SHAPE)
    # Collapse the leading dims into one row index: each must step by the
    # next one's whole extent (size-1 dims do not matter).
    lead = [(int(n), int(s)) for n, s in zip(shape[:-1], strides[:-1])
            if n != 1]
    if not lead:
        return T, V, V
    for (n0, s0), (n1, s1) in zip(lead, lead[1:]):
        if s0 != s1 * n1:
            raise XentError(fix, C.ERR_SHAPE)
    rs = lead[-1][1]
    if rs % itemsize or rs // itemsize < V:
        raise XentError(fix, C.ERR_SHAPE)
    return T, V, rs // itemsize


def _labels(labels, batch_shape):
    """Contiguous int32/int64 labels of the logits' leading shape."""
    if labels is None:
        raise XentError("labels is None: pass an integer array of shape %s"
                        % (tuple(batch_shape),), C.ERR_NULL)
    lab = np.asarray(labels)
    if lab.dtype.name not in ("int32", "int64"):
        raise XentTypeError("labels dtype %s is not supported: use int64 "
                            "(or int32)" % lab.dtype.name)
    if tuple(lab.shape) != tuple(batch_shape):
        raise XentError("labels shape %s does not match the logits' leading "
                        "shape %s" % (tuple(lab.shape), tuple(batch_shape)),
                        C.ERR_SHAPE)
    lab = np.ascontiguousarray(lab)   # [T] labels: a small copy if strided
    return lab, (C.I32 if lab.dtype.name == "int32" else C.I64)


class Prepared:
    """A ctypes xent_ce_input over NumPy arrays, keeping them alive."""

    def __init__(self, logits, labels, dtype=None, need_labels=True):
        if not isinstance(logits, np.ndarray):
            raise XentTypeError("logits must be a numpy.ndarray (or a torch "
                                "tensor), got %s" % type(logits).__name__)
        self.logits = logits
        self.dtype = _logits_dtype(logits, dtype)
        self.T, self.V, self.ld = row_layout(logits.shape, logits.strides,
                                             logits.itemsize)
        self.batch_shape = logits.shape[:-1]
        self.inp = C.CeInput()
        self.inp.logits = logits.ctypes.data if logits.size else None
        self.inp.dtype = self.dtype
        self.inp.T, self.inp.V, self.inp.ld = self.T, self.V, self.ld
        self.labels = None
        if labels is not None or need_labels:
            self.labels, ldt = _labels(labels, self.batch_shape)
            self.inp.labels = self.labels.ctypes.data
            self.inp.label_dtype = ldt
        self.inp.grad_rows = None
        self.rows = None

    def set_grad_rows(self, g):
        """Per-row upstream gradient (reduction 'none'): [T] float32."""
        g = np.asarray(g, dtype=np.float32)
        if g.ndim:
            if tuple(g.shape) != tuple(self.batch_shape):
                raise XentError("grad_output shape %s does not match the "
                                "loss shape %s" % (tuple(g.shape),
                                                   tuple(self.batch_shape)),
                                C.ERR_SHAPE)
        else:
            g = np.full(self.batch_shape, g, dtype=np.float32)
        self.rows = np.ascontiguousarray(g)
        self.inp.grad_rows = self.rows.ctypes.data


def _ptr(a):
    return None if a is None else a.ctypes.data


def _loss_buffer(prep, reduction):
    return np.empty(prep.T if reduction == "none" else 1, dtype=np.float32)


def _loss_value(loss, prep, reduction):
    if reduction == "none":
        return loss.reshape(prep.batch_shape)
    return loss[0]


def _grad_buffer(prep, grad_dtype, inplace):
    """The gradient's array, its xent dtype and row stride."""
    if inplace:
        if not prep.logits.flags.writeable:
            raise XentError("inplace=True needs writeable logits",
                            C.ERR_VALUE)
        if grad_dtype is not None and \
                _KW_DTYPES.get(str(grad_dtype).lower()) != prep.dtype:
            raise XentTypeError("inplace=True writes the gradient in the "
                                "logits' own dtype; drop grad_dtype")
        return prep.logits, prep.dtype, prep.ld
    gdt = prep.dtype if grad_dtype is None else \
        _KW_DTYPES.get(str(grad_dtype).lower())
    if gdt is None:
        raise XentTypeError("grad_dtype = %r: must be 'f32', 'bf16' or "
                            "'f16'" % (grad_dtype,))
    if gdt == prep.dtype:
        npdt = prep.logits.dtype
    else:
        npdt = {C.F32: np.float32, C.F16: np.float16}.get(gdt, np.uint16)
    return np.empty(prep.logits.shape, dtype=npdt), gdt, prep.V


def cross_entropy(logits, labels, *, ignore_index=-100, reduction="mean",
                  normalizer=None, temperature=1.0, softcap=None, z_loss=0.0,
                  label_smoothing=0.0, dtype=None, vocab_start=0,
                  vocab_total=0, threads=0):
    """Forward loss of [..., V] logits against [...] labels: a float32
    scalar for 'mean'/'sum', a float32 array of the labels' shape for
    'none'."""
    opts = C.make_opts(ignore_index=ignore_index, reduction=reduction,
                       normalizer=normalizer, temperature=temperature,
                       softcap=softcap, z_loss=z_loss,
                       label_smoothing=label_smoothing,
                       vocab_start=vocab_start, vocab_total=vocab_total,
                       threads=threads)
    prep = Prepared(logits, labels, dtype)
    loss = _loss_buffer(prep, reduction)
    out = C.CeOutput()
    out.loss = _ptr(loss)
    C.LIB.call("xent_ce", ctypes.byref(prep.inp), ctypes.byref(opts),
               ctypes.byref(out))
    return _loss_value(loss, prep, reduction)


def cross_entropy_grad(logits, labels, *, ignore_index=-100,
                       reduction="mean", normalizer=None, temperature=1.0,
                       softcap=None, z_loss=0.0, label_smoothing=0.0,
                       grad_output=1.0, inplace=False, grad_dtype=None,
                       dtype=None, vocab_start=0, vocab_total=0, threads=0):
    """Loss and dL/dlogits in one pass: returns (loss, grad).

    grad_output is the upstream gradient: a scalar, or for reduction 'none'
    an array of the labels' shape. grad has the logits' shape and dtype
    (grad_dtype= 'f32'/'bf16'/'f16' picks another); inplace=True writes it
    over the logits and returns the logits array as grad."""
    scalar_g = np.ndim(grad_output) == 0
    if reduction != "none" and not scalar_g:
        raise XentError("grad_output must be a scalar for reduction %r"
                        % (reduction,), C.ERR_SHAPE)
    opts = C.make_opts(ignore_index=ignore_index, reduction=reduction,
                       normalizer=normalizer, temperature=temperature,
                       softcap=softcap, z_loss=z_loss,
                       label_smoothing=label_smoothing,
                       grad_scale=float(grad_output) if scalar_g else 1.0,
                       vocab_start=vocab_start, vocab_total=vocab_total,
                       threads=threads)
    prep = Prepared(logits, labels, dtype)
    if not scalar_g:
        prep.set_grad_rows(grad_output)
    grad, gdt, ldg = _grad_buffer(prep, grad_dtype, inplace)
    loss = _loss_buffer(prep, reduction)
    out = C.CeOutput()
    out.loss = _ptr(loss)
    out.grad = grad.ctypes.data if grad.size else None
    out.grad_dtype, out.ld_grad = gdt, ldg
    if prep.T and prep.V and out.grad is None:
        raise XentError("internal: no gradient buffer", C.ERR_INTERNAL)
    C.LIB.call("xent_ce", ctypes.byref(prep.inp), ctypes.byref(opts),
               ctypes.byref(out))
    return _loss_value(loss, prep, reduction), grad


def logprobs(logits, labels, *, temperature=1.0, entropy=False,
             ignore_index=-100, softcap=None, dtype=None, threads=0):
    """Per-token log p(label) of [..., V] logits, float32 of the labels'
    shape (0 on rows whose label is ignore_index); with entropy=True returns
    (logprob, entropy). Forward only: no [T, V] buffer is allocated."""
    opts = C.make_opts(ignore_index=ignore_index, reduction="none",
                       temperature=temperature, softcap=softcap,
                       threads=threads)
    prep = Prepared(logits, labels, dtype)
    lp = np.empty(prep.T, dtype=np.float32)
    ent = np.empty(prep.T, dtype=np.float32) if entropy else None
    C.LIB.call("xent_logprobs", ctypes.byref(prep.inp), ctypes.byref(opts),
               _ptr(lp), _ptr(ent))
    lp = lp.reshape(prep.batch_shape)
    if entropy:
        return lp, ent.reshape(prep.batch_shape)
    return lp
