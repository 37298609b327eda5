"""PyTorch front end: an autograd Function over the C kernels (CPU, and
CUDA when the library was built with it), the nn.Module, log-probs, and the
vocabulary-parallel path over torch.distributed."""
import ctypes
import threading

import torch

from . import _capi as C
from ._capi import XentError, XentTypeError
from ._np import row_layout

_DTYPES = {torch.float32: C.F32, torch.bfloat16: C.BF16,
           torch.float16: C.F16}


class Backend:
    """CPU calls; the CUDA subclass adds the stream argument. `exact` only
    matters on CUDA (the CPU path is always the exact one)."""
    prefix = "xent_"

    def __init__(self, device, exact=False):
        self.device, self.exact = device, bool(exact)

    def args(self):
        return ()

    def call(self, name, *args):
        C.LIB.call(self.prefix + name, *(args + self.args()))


class CudaBackend(Backend):
    """Calls on the tensor's device and torch's current stream. Under CUDA
    graph capture the label check (which synchronizes) is turned off for
    the call: a bad label then gives a NaN row instead of an exception.
    exact=True puts 16-bit logits on the precise path for the call
    (xent_cuda_set_exact)."""
    prefix = "xent_cuda_"

    def args(self):
        return (ctypes.c_void_p(torch.cuda.current_stream(
            self.device).cuda_stream),)

    def call(self, name, *args):
        capturing = torch.cuda.is_current_stream_capturing()
        check = C.LIB.fn("xent_cuda_set_label_check")
        exact = C.LIB.fn("xent_cuda_set_exact")
        with torch.cuda.device(self.device):
            prev = check(0) if capturing else None
            prev_exact = exact(1 if self.exact else 0)
            try:
                super().call(name, *args)
            finally:
                exact(prev_exact)
                if prev is not None:
                    check(prev)


def cuda_available():
    """True when libxent was built with CUDA and torch sees a GPU."""
    if not torch.cuda.is_available():
        return False
    try:
        return C.LIB.has("xent_cuda_ce") and "cuda" in C.version()
    except XentError:
        return False


def _backend(t):
    if t.device.type == "cpu":
        return Backend(t.device)
    if t.device.type == "cuda":
        if not cuda_available():
            raise XentTypeError("logits are on %s but this build of libxent "
                                "(%s) has no CUDA support; rebuild it with "
                                "nvcc on PATH, or move the logits to the CPU"
                                % (t.device, C.version()))
        return CudaBackend(t.device)
    raise XentTypeError("logits on device %s are not supported (cpu, cuda)"
                        % t.device)


class Prepared:
    """An xent_ce_input over torch tensors (kept alive here)."""

    def __init__(self, logits, labels, need_labels=True, exact=False,
                 allow_f64=False):
        if not isinstance(logits, torch.Tensor):
            raise XentTypeError("logits must be a torch.Tensor, got %s"
                                % type(logits).__name__)
        dt = _DTYPES.get(logits.dtype)
        if allow_f64 and logits.dtype == torch.float64:
            if logits.device.type != "cpu":
                raise XentTypeError(
                    "float64 logits are supported on the CPU only "
                    "(xent_ce_f64); logits are on %s: call .float() first, "
                    "or move them to the CPU" % logits.device)
            dt = C.F64
        if dt is None:
            raise XentTypeError(
                "logits dtype %s is not supported (float32, bfloat16, "
                "float16)%s" % (logits.dtype, "; call .float() first"
                                if logits.dtype == torch.float64 else ""))
        self.backend = _backend(logits)
        self.backend.exact = bool(exact)
        es = logits.element_size()
        self.T, self.V, self.ld = row_layout(
            tuple(logits.shape), tuple(s * es for s in logits.stride()), es)
        self.logits, self.dtype = logits, dt
        self.batch_shape = tuple(logits.shape[:-1])
        self.inp = C.CeInput()
        self.inp.logits = logits.data_ptr()
        self.inp.dtype = dt
        self.inp.T, self.inp.V, self.inp.ld = self.T, self.V, self.ld
        self.labels = None
        if labels is not None or need_labels:
            self._set_labels(labels)

    def _set_labels(self, labels):
        if not isinstance(labels, torch.Tensor):
            raise XentTypeError("labels must be a torch.Tensor, got %s"
                                % type(labels).__name__)
        if labels.dtype not in (torch.int64, torch.int32):
            raise XentTypeError("labels dtype %s is not supported: use "
                                "torch.long (or torch.int32)" % labels.dtype)
        if labels.device != self.logits.device:
            raise XentTypeError("labels are on %s but logits on %s"
                                % (labels.device, self.logits.device))
        if tuple(labels.shape) != self.batch_shape:
            raise XentError(
                "labels shape %s does not match the logits' leading shape %s "
                "(xent takes the class dimension last: logits [..., V], "
                "labels [...]; for torch's [N, C, d...] layout pass "
                "logits.movedim(1, -1))" % (tuple(labels.shape),
                                            self.batch_shape), C.ERR_SHAPE)
        self.labels = labels.contiguous()   # [T]: a small copy if strided
        self.inp.labels = self.labels.data_ptr()
        self.inp.label_dtype = C.I32 if labels.dtype == torch.int32 else C.I64

    def empty(self, *shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device=self.logits.device)


def _p(t):
    return None if t is None else t.data_ptr()


# --- [T, V] gradient buffers on the CPU -------------------------------------
# A gradient is a new [T, V] tensor on every call (autograd hands it on). On
# the CPU a fresh buffer of that size comes straight from the kernel (mmap)
# and is returned to it when freed, so every call pays one page fault and
# one page clear per 4 KiB: about as long as the kernel itself for fp32 at
# T = 2048, V = 128256 (huge pages cut the faults but stall in compaction on
# a busy machine). So large CPU gradients come from a small pool of buffers
# that xent keeps: a buffer is handed out again only once no tensor uses it
# any more (its NumPy owner has no reference but the pool's), the way torch's
# CUDA caching allocator reuses device memory. The memory of the last few
# gradients therefore stays with the process; release_buffers() frees what
# no tensor uses, and REUSE_BUFFERS = False turns the pool off.
REUSE_BUFFERS = True
_REUSE_MIN = 8 << 20           # bytes: smaller buffers come from torch.empty
_POOL_MAX = 4                  # buffers kept at most (free or in use)
_pool = []                     # [numpy uint8 arrays]
_pool_lock = threading.Lock()


def release_buffers():
    """Frees the pooled gradient buffers that no tensor uses; returns the
    number of bytes freed."""
    import sys
    n = 0
    with _pool_lock:
        keep = []
        while _pool:
            a = _pool.pop()
            if sys.getrefcount(a) > 2:     # `a`, getrefcount's argument
                keep.append(a)
            else:
                n += a.nbytes
            del a
        _pool.extend(reversed(keep))
    return n


def empty_rows(shape, dtype, device):
    """An uninitialized contiguous tensor for a buffer that the kernel writes
    whole (the gradient): torch.empty, or on the CPU for a large one a
    buffer of the pool (see REUSE_BUFFERS)."""
    n = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    if (not REUSE_BUFFERS or torch.device(device).type != "cpu"
            or n < _REUSE_MIN):
        return torch.empty(shape, dtype=dtype, device=device)
    import sys
    import numpy as np
    with _pool_lock:
        arr = None
        for a in _pool:       # refs of a free one: _pool, `a`, the argument
            if a.nbytes == n and sys.getrefcount(a) <= 3:
                arr = a
                break
        if arr is None:
            arr = np.empty(n, dtype=np.uint8)
            if len(_pool) >= _POOL_MAX:     # make room: drop a free one
                for i, a in enumerate(_pool):
                    if sys.getrefcount(a) <= 3:
                        del _pool[i]
                        break
            if len(_pool) < _POOL_MAX:
                _pool.append(arr)
        a = None
        return torch.from_numpy(arr).view(dtype).view(shape)


def _out(loss=None, stats=None, lp=None, ent=None):
    o = C.CeOutput()
    o.loss, o.stats = _p(loss), _p(stats)
    o.logprob, o.entropy = _p(lp), _p(ent)
    return o


def f64_out(loss=None, stats=None, lp=None, ent=None, grad=None):
    """An xent_ce_output_f64 over float64 tensors (None: not computed)."""
    o = C.CeOutputF64()
    o.loss, o.stats = _p(loss), _p(stats)
    o.logprob, o.entropy = _p(lp), _p(ent)
    if grad is not None:
        o.grad, o.ld_grad = grad.data_ptr(), grad.stride(-2) \
            if grad.dim() >= 2 else grad.shape[-1]
    return o


def call_f64(prep, opts, out, grad_rows=None):
    """xent_ce_f64 (float64 logits on the CPU): every output faithfully
    rounded in float64 (docs/numerics.md, "The float64 path"). grad_rows:
    a [T] float64 tensor of per-row upstream gradients (reduction 'none')
    or None. Returns (n_counted, n_nonfinite) as ints."""
    cnt = torch.zeros(2, dtype=torch.int64)
    out.n_counted = cnt.data_ptr()
    out.n_nonfinite = cnt.data_ptr() + 8
    rows = None
    if grad_rows is not None:
        rows = grad_rows.reshape(-1).to(torch.float64).contiguous()
    C.LIB.call("xent_ce_f64", ctypes.byref(prep.inp), ctypes.byref(opts),
               ctypes.c_void_p(_p(rows)), ctypes.byref(out))
    del rows
    return int(cnt[0]), int(cnt[1])


def _forward_done(ctx, cfg, prep, loss, grad):
    """The cross-entropy Functions' common forward tail: what the backward
    needs (the labels as prepared, a fused gradient), and the loss shaped
    as the call asked."""
    ctx.cfg, ctx.prep_labels = cfg, prep.labels
    ctx.pre = grad
    ctx.done = False
    if cfg.reduction == "none":
        return loss.view(prep.batch_shape)
    return loss.view(())


def _backward_start(ctx, g):
    """Refuses a second backward over an in-place gradient; returns the
    gradient the forward already wrote (take_fused_grad), or None."""
    if ctx.done and ctx.cfg.inplace:
        raise XentError("inplace_backward=True: the logits buffer "
                        "already holds the gradient; a second backward "
                        "is not possible", C.ERR_VALUE)
    ctx.done = True
    return take_fused_grad(ctx, g) if ctx.pre is not None else None


def _prepared_again(ctx, logits, **kw):
    """The logits prepared for the backward, with the forward's labels."""
    prep = Prepared(logits, None, need_labels=False, **kw)
    prep.labels = ctx.prep_labels
    prep.inp.labels = prep.labels.data_ptr()
    prep.inp.label_dtype = (C.I32 if prep.labels.dtype == torch.int32
                            else C.I64)
    return prep


class _CrossEntropyF64(torch.autograd.Function):
    """xent.cross_entropy on float64 CPU logits: xent_ce_f64 (faithful
    float64 loss and gradient). The backward recomputes the rows from the
    logits (no saved statistics are needed); with FUSED_BACKWARD the
    forward writes the gradient of a scalar loss in the same pass."""

    @staticmethod
    def forward(ctx, logits, labels, cfg):
        if cfg.group is not None:
            raise XentError("process_group: vocabulary-parallel float64 "
                            "logits are not supported (use float32)",
                            C.ERR_UNSUPPORTED)
        prep = Prepared(logits, labels, allow_f64=True)
        opts = C.make_opts(**cfg.opts)
        T_ = prep.T
        loss = prep.empty(T_ if cfg.reduction == "none" else 1,
                          dtype=torch.float64)
        grad = None
        if (FUSED_BACKWARD and ctx.needs_input_grad[0] and not cfg.inplace
                and cfg.reduction != "none" and prep.T and prep.V):
            grad = empty_rows((prep.T, prep.V), torch.float64, logits.device)
        call_f64(prep, opts, f64_out(loss=loss, grad=grad))
        ctx.save_for_backward(logits)
        return _forward_done(ctx, cfg, prep, loss, grad)

    @staticmethod
    def backward(ctx, g):
        logits, = ctx.saved_tensors
        cfg = ctx.cfg
        pre = _backward_start(ctx, g)
        if pre is not None:
            return pre.view(logits.shape), None, None
        prep = _prepared_again(ctx, logits, allow_f64=True)
        opts = C.make_opts(**cfg.opts)
        rows = None
        if cfg.reduction == "none":
            rows = g
        else:
            opts.grad_scale = float(g.item())
        if cfg.inplace:
            grad = logits
            out = f64_out()
            out.grad, out.ld_grad = logits.data_ptr(), prep.ld
        else:
            grad = empty_rows((prep.T, prep.V), torch.float64, logits.device)
            out = f64_out(grad=grad)
        call_f64(prep, opts, out, grad_rows=rows)
        return grad.view(logits.shape), None, None


def _all_gather_partials(part, group):
    """[T, 6] words per rank -> [S, T, 6], shard-major (rank order)."""
    import torch.distributed as dist
    S = dist.get_world_size(group)
    bufs = [torch.empty_like(part) for _ in range(S)]
    dist.all_gather(bufs, part, group=group)
    return torch.stack(bufs)


def _vocab_total(V, device, group):
    import torch.distributed as dist
    t = torch.tensor([V], dtype=torch.int64, device=device)
    dist.all_reduce(t, group=group)
    return int(t.item())


def forward_stats(prep, opts, reduction, group=None, grad=None):
    """Loss ([T] or [1] float32), per-row stats ([T, 2] float64) and the
    number of counted rows ([1] int64), all on the logits' device. grad
    (unsharded only): a dense [T, V] tensor of the logits' dtype that the
    same kernel call fills with dL/dz (upstream gradient opts.grad_scale)."""
    loss = prep.empty(prep.T if reduction == "none" else 1)
    stats = prep.empty(prep.T, C.STATS_DOUBLES, dtype=torch.float64)
    count = prep.empty(1, dtype=torch.int64)
    out = _out(loss, stats)
    out.n_counted = count.data_ptr()
    if grad is not None:
        out.grad, out.grad_dtype, out.ld_grad = (grad.data_ptr(), prep.dtype,
                                                 prep.V)
    be = prep.backend
    if group is None:
        be.call("ce", ctypes.byref(prep.inp), ctypes.byref(opts),
                ctypes.byref(out))
        return loss, stats, count
    part = prep.empty(prep.T, C.PARTIAL_WORDS, dtype=torch.int64)
    be.call("ce_shard_stats", ctypes.byref(prep.inp), ctypes.byref(opts),
            ctypes.c_void_p(part.data_ptr()))
    parts = _all_gather_partials(part, group).contiguous()  # [S, T, 6]
    be.call("ce_combine", ctypes.c_void_p(parts.data_ptr()),
            ctypes.c_int(parts.shape[0]), ctypes.byref(prep.inp),
            ctypes.byref(opts), ctypes.byref(out))
    return loss, stats, count


# The CPU fwd+bwd fusion: when the logits need a gradient and the loss is a
# scalar, the forward's kernel call also writes the gradient for an upstream
# gradient of 1 (one pass over the logits, as the C call xent_ce: the
# backward then costs nothing when the upstream gradient is exactly 1, the
# usual loss.backward()); any other upstream gradient recomputes it from the
# saved logits and statistics, exactly as without the fusion. The price: the
# [T, V] gradient is held from the forward to the backward (torch's own
# F.cross_entropy holds its [T, V] log-softmax the same way).
FUSED_BACKWARD = True


def set_fused_backward(enabled):
    """Turns the CPU fwd+bwd fusion on or off (xent.cross_entropy and
    xent.nn.functional.cross_entropy); returns the previous setting. Off,
    nothing [T, V] is held between the forward and the backward, and the
    backward reads the logits again (about 1.7x the time of fwd+bwd)."""
    global FUSED_BACKWARD
    prev, FUSED_BACKWARD = FUSED_BACKWARD, bool(enabled)
    return prev


def take_fused_grad(ctx, g):
    """The gradient the fused forward stored in ctx.pre when the upstream
    gradient g (a scalar tensor) is exactly 1, else None. Hands the tensor
    over (ctx.pre is cleared, so autograd can keep it as .grad without a
    copy, and a second backward recomputes)."""
    pre, ctx.pre = ctx.pre, None
    if pre is None or g.numel() != 1 or float(g) != 1.0:
        return None
    return pre


class _CrossEntropy(torch.autograd.Function):
    """Saves the logits and the per-row stats; the backward recomputes the
    softmax from them (a second read of the logits), except on the CPU fast
    path (FUSED_BACKWARD) where the forward already wrote the gradient."""

    @staticmethod
    def forward(ctx, logits, labels, cfg):
        prep = Prepared(logits, labels, exact=cfg.exact)
        opts = C.make_opts(**cfg.opts)
        grad = None
        if (FUSED_BACKWARD and ctx.needs_input_grad[0] and cfg.group is None
                and not cfg.inplace and cfg.reduction != "none"
                and logits.device.type == "cpu" and prep.T and prep.V):
            grad = empty_rows(tuple(logits.shape), logits.dtype,
                              logits.device)
        loss, stats, count = forward_stats(prep, opts, cfg.reduction,
                                           cfg.group, grad=grad)
        ctx.count = count
        ctx.save_for_backward(logits, stats)
        return _forward_done(ctx, cfg, prep, loss, grad)

    @staticmethod
    def backward(ctx, g):
        logits, stats = ctx.saved_tensors
        cfg = ctx.cfg
        pre = _backward_start(ctx, g)
        if pre is not None:
            return pre, None, None
        prep = _prepared_again(ctx, logits, exact=cfg.exact)
        opts = C.make_opts(**cfg.opts)
        rows = _upstream(g, prep, opts, cfg, ctx.count)   # [T] or None
        if cfg.inplace:                         # dL/dz over the logits
            grad, ldg = logits, prep.ld
        else:                                   # [..., V], dense rows
            grad = empty_rows(tuple(logits.shape), logits.dtype,
                              logits.device)
            ldg = prep.V
        prep.backend.call("ce_backward", ctypes.byref(prep.inp),
                          ctypes.byref(opts),
                          ctypes.c_void_p(stats.data_ptr()),
                          ctypes.c_void_p(grad.data_ptr()),
                          ctypes.c_int(prep.dtype), ctypes.c_int64(ldg))
        del rows                # grad_rows pointed into it until here
        return grad, None, None


def _upstream(g, prep, opts, cfg, count):
    """Puts the upstream gradient g into opts / prep.inp; returns the [T]
    float32 buffer it points at (or None).

    reduction 'none': g is [T], passed as grad_rows. A scalar loss: g is
    read on the host as grad_scale (exact), except under CUDA graph capture
    where nothing may synchronize: then the backward runs as reduction
    'none' with grad_rows = g broadcast to [T] and the mean's 1/n folded in
    (1/normalizer exactly; with n the device count of targets, g/n is
    rounded once to float32 first: one extra rounding of the gradient)."""
    if cfg.reduction == "none":
        rows = g.reshape(-1).to(torch.float32).contiguous()         # [T]
        prep.inp.grad_rows = rows.data_ptr()
        return rows
    if not (g.is_cuda and torch.cuda.is_current_stream_capturing()):
        opts.grad_scale = float(g.item())
        return None
    g = g.reshape(1).to(torch.float32)
    if cfg.reduction == "mean":
        n = opts.normalizer
        if n > 0:
            opts.grad_scale = 1.0 / n
        else:
            g = (g.double() / count.clamp(min=1).double()).float()
    opts.reduction = C.REDUCE_NONE
    rows = g.expand(prep.T).contiguous()                             # [T]
    prep.inp.grad_rows = rows.data_ptr()
    return rows


class _Config:
    """Options of one cross_entropy call (what the backward needs)."""

    def __init__(self, reduction, inplace, group, opts, exact=False):
        self.reduction, self.inplace = reduction, inplace
        self.group, self.opts, self.exact = group, opts, bool(exact)


def cross_entropy(logits, labels, *, ignore_index=-100, reduction="mean",
                  normalizer=None, temperature=1.0, softcap=None, z_loss=0.0,
                  label_smoothing=0.0, inplace_backward=False,
                  process_group=None, vocab_start=0, vocab_total=None,
                  threads=0, exact=False):
    """exact=True: on CUDA, 16-bit logits take the precise path (every
    output within 2 ulp of the CPU's, docs/cuda.md), at a cost in time;
    the default fast path is within 4 ulp. The CPU is always exact.
    float64 logits on the CPU go through xent_ce_f64: a float64 loss and
    gradient, faithfully rounded (no softcap, no process_group)."""
    if reduction not in C.REDUCTIONS:
        raise XentError("reduction = %r: must be one of 'none', 'sum', "
                        "'mean'" % (reduction,), C.ERR_VALUE)
    if vocab_total is None:
        vocab_total = 0
        if process_group is not None:
            vocab_total = _vocab_total(int(logits.shape[-1]), logits.device,
                                       process_group)
    opts = dict(ignore_index=ignore_index, reduction=reduction,
                normalizer=normalizer, temperature=temperature,
                softcap=softcap, z_loss=z_loss,
                label_smoothing=label_smoothing, vocab_start=vocab_start,
                vocab_total=vocab_total, threads=threads)
    C.make_opts(**opts)   # early check of the option values' types
    cfg = _Config(reduction, bool(inplace_backward), process_group, opts,
                  exact)
    if (isinstance(logits, torch.Tensor) and logits.dtype == torch.float64
            and logits.device.type == "cpu"):
        return _CrossEntropyF64.apply(logits, labels, cfg)
    return _CrossEntropy.apply(logits, labels, cfg)


def logprobs(logits, labels, *, temperature=1.0, entropy=False,
             ignore_index=-100, softcap=None, threads=0, exact=False):
    """Per-token log p(label) (float32, labels' shape; float64 for float64
    logits on the CPU, faithfully rounded) and, with entropy=True, the
    entropy too. Forward only (no autograd graph). exact: as for
    cross_entropy."""
    f64 = (isinstance(logits, torch.Tensor)
           and logits.dtype == torch.float64 and logits.device.type == "cpu")
    prep = Prepared(logits.detach(), labels, exact=exact, allow_f64=f64)
    opts = C.make_opts(ignore_index=ignore_index, reduction="none",
                       temperature=temperature, softcap=softcap,
                       threads=threads)
    if f64:       # float64 logits: float64 outputs, faithfully rounded
        lp = prep.empty(prep.T, dtype=torch.float64)
        ent = prep.empty(prep.T, dtype=torch.float64) if entropy else None
        call_f64(prep, opts, f64_out(lp=lp, ent=ent))
        lp = lp.view(prep.batch_shape)
        return (lp, ent.view(prep.batch_shape)) if entropy else lp
    lp = prep.empty(prep.T)
    ent = prep.empty(prep.T) if entropy else None
    prep.backend.call("logprobs", ctypes.byref(prep.inp), ctypes.byref(opts),
                      ctypes.c_void_p(lp.data_ptr()),
                      ctypes.c_void_p(_p(ent)))
    lp = lp.view(prep.batch_shape)
    return (lp, ent.view(prep.batch_shape)) if entropy else lp


class CrossEntropyLoss(torch.nn.Module):
    """Drop-in for torch.nn.CrossEntropyLoss (class dimension last).

    Same argument names as torch where they exist; `weight`, `size_average`
    and `reduce` are not supported (must stay None). Extra: temperature,
    softcap, z_loss, normalizer, inplace_backward, process_group,
    vocab_start, vocab_total, exact."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100,
                 reduce=None, reduction="mean", label_smoothing=0.0, *,
                 temperature=1.0, softcap=None, z_loss=0.0, normalizer=None,
                 inplace_backward=False, process_group=None, vocab_start=0,
                 vocab_total=None, exact=False):
        super().__init__()
        for name, v in (("weight", weight), ("size_average", size_average),
                        ("reduce", reduce)):
            if v is not None:
                raise XentError("xent.CrossEntropyLoss: %s is not supported "
                                "(leave it None)" % name, C.ERR_VALUE)
        if reduction not in C.REDUCTIONS:
            raise XentError("reduction = %r: must be one of 'none', 'sum', "
                            "'mean'" % (reduction,), C.ERR_VALUE)
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing = label_smoothing
        self.kw = dict(temperature=temperature, softcap=softcap,
                       z_loss=z_loss, normalizer=normalizer,
                       inplace_backward=inplace_backward,
                       process_group=process_group, vocab_start=vocab_start,
                       vocab_total=vocab_total, exact=exact)

    def forward(self, input, target):
        return cross_entropy(input, target, ignore_index=self.ignore_index,
                             reduction=self.reduction,
                             label_smoothing=self.label_smoothing, **self.kw)

    def extra_repr(self):
        return "ignore_index=%d, reduction=%r" % (self.ignore_index,
                                                  self.reduction)
