"""The chunked LM head fused with the cross-entropy (issue 45), one
implementation for two backends: torch CPU tensors with the exact CPU
kernels (xent_ce_shard_stats / _combine / _backward, include/xent.h), and
torch CUDA tensors with their CUDA twins (xent_cuda_ce_*, include/xent/
cuda.h, on torch's current stream) and torch.mm on the device. Rows in
chunks, each chunk's fp32 logits through the kernel, never a [T, V] tensor.

CPU tensors always take this path (xent.linear_cross_entropy /
linear_logprobs). CUDA tensors take it from xent/_linear.py when the call
asks for what the one-call CUDA head (xent_cuda_linear_ce) lacks: a
differentiable linear_logprobs (the entropy's gradient included),
grad_accum, process_group / vocab_start / vocab_block; the plain loss keeps
the one-call path.

For each chunk of rows (default: about 32 MiB of fp32 logits, see
`_chunk_rows`):

  z_c = hidden_c @ weight^T (+ bias)       torch.mm in float32 (bf16 / f16
                                           inputs are upcast first: their
                                           products are exact in fp32; on
                                           CUDA the weight a block at a
                                           time, no fp32 copy of it, and
                                           torch's TF32 setting applies)
  xent_ce_shard_stats(z_c) -> partials     48 bytes a row, kept for all T

then one xent_ce_combine over the T rows' partials writes the loss, the
per-row statistics (lse, nll: 16 bytes a row) and the log-probs / entropy.
xent_ce runs exactly these steps with one shard (include/xent.h), so the
loss and every per-row output are bitwise those of `xent.cross_entropy` on
the same fp32 logits (the row-block summation order included).

The backward recomputes each chunk's logits, writes dL/dz_c over them in
place (xent_ce_backward from the saved statistics; the entropy term of
`linear_logprobs` in float64 torch ops) and accumulates

  dhidden_c = dz_c @ weight                (fp32, then the hidden's dtype)
  dweight  += dz_c^T @ hidden_c            (fp32, chunk by chunk)
  dbias    += column sums of dz_c          (float64, rounded once)

dweight goes into an fp32 buffer: a fresh one (returned to autograd in the
weight's dtype), or, with grad_accum="main_grad" / "fp32_grad", the
caller's `weight.main_grad` / fp32 `weight.grad`, added in place with no
copy of dW in any other dtype.

CUDA: the chunks' kernels run on torch's current stream; the labels are
checked once up front (one synchronization, skipped under CUDA graph
capture), then every kernel runs with the label check off; the reduction
'mean' backward and the entropy-gradient test read one scalar each.
Chunks default to about 256 MiB of fp32 logits there (32 MiB on the CPU).

Vocabulary parallel (process_group=...): each rank holds rows [vocab_start,
vocab_start + V_r) of the weight. Its chunks' partials (per vocabulary block)
are all-gathered and combined in global column order; every rank gets the
same loss and statistics; the backward writes the rank's weight (and bias)
rows and all-reduces dhidden (float64 sums of the blocks' fp32 products,
rounded once; with NCCL on the device, with gloo through CPU copies). With
vocab_block=k the rank's columns are processed in blocks
that start at global multiples of k, so the whole computation is the same
sequence of operations on the same values whatever the number of ranks
(bitwise equal across TP degrees whose boundaries are multiples of k).
"""
import contextlib
import ctypes

import torch

from . import _capi as C
from . import _torch
from ._capi import XentError, XentTypeError

_DT = {torch.float32: C.F32, torch.bfloat16: C.BF16, torch.float16: C.F16}
CHUNK_BYTES = 32 << 20          # fp32 logits per chunk (default, CPU)
CHUNK_BYTES_CUDA = 256 << 20    # the same on a CUDA device
GRAD_ACCUM = (None, "main_grad", "fp32_grad")


def _chunk_rows(chunk_rows, T, V, chunk_bytes=CHUNK_BYTES):
    if chunk_rows:
        return max(1, min(int(chunk_rows), max(T, 1)))
    return max(1, min(max(T, 1), chunk_bytes // (4 * max(V, 1))))


# --- arguments (shared with the one-call CUDA head, xent/_linear.py) --------


def check_labels(fn, labels, batch_shape):
    """labels [...] int64 / int32 of hidden's leading shape; returns them
    flat and contiguous [T]."""
    if not isinstance(labels, torch.Tensor):
        raise XentTypeError("%s: labels must be a torch.Tensor, got %s"
                            % (fn, type(labels).__name__))
    if labels.dtype not in (torch.int64, torch.int32):
        raise XentTypeError("%s: labels dtype %s is not supported: use "
                            "torch.long (or torch.int32)"
                            % (fn, labels.dtype))
    if tuple(labels.shape) != tuple(batch_shape):
        raise XentError("%s: labels shape %s does not match hidden's "
                        "leading shape %s (hidden [..., H], labels [...])"
                        % (fn, tuple(labels.shape), tuple(batch_shape)),
                        C.ERR_SHAPE)
    return labels.reshape(-1).contiguous()


def check_inputs(fn, hidden, weight, bias, labels, device_type,
                 same_dtype=False):
    """Types, devices, dtypes and shapes of a fused-head call: every tensor
    a torch.Tensor on one device of device_type ('cpu' or 'cuda'); hidden,
    weight, bias float32 / bfloat16 / float16 (one dtype when same_dtype);
    hidden [..., H], weight [V, H], bias [V], labels hidden's [...]
    (checked when given). Returns (batch_shape, H, V)."""
    names = (("hidden", hidden), ("weight", weight), ("bias", bias),
             ("labels", labels))
    for name, t in names:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise XentTypeError("%s: %s must be a torch.Tensor, got %s"
                                % (fn, name, type(t).__name__))
        if t.device.type != device_type:
            if device_type == "cuda":
                raise XentTypeError("%s needs CUDA tensors (%s is on %s)"
                                    % (fn, name, t.device))
            raise XentTypeError("%s: %s is on %s; the CPU path takes CPU "
                                "tensors (all of them)"
                                % (fn, name, t.device))
    for name, t in names[1:]:
        if t is not None and t.device != hidden.device:
            raise XentTypeError("%s: %s is on %s but hidden on %s"
                                % (fn, name, t.device, hidden.device))
    for name, t in names[:3]:
        if t is None:
            continue
        if t.dtype not in _DT:
            raise XentTypeError("%s: %s dtype %s is not supported "
                                "(float32, bfloat16, float16)"
                                % (fn, name, t.dtype))
        if same_dtype and t.dtype != hidden.dtype:
            raise XentTypeError("%s: %s dtype %s differs from hidden dtype "
                                "%s (they must be the same)"
                                % (fn, name, t.dtype, hidden.dtype))
    if hidden.dim() < 1 or weight.dim() != 2:
        raise XentError("%s: hidden must be [..., H] and weight [V, H]; "
                        "got hidden %s, weight %s"
                        % (fn, tuple(hidden.shape), tuple(weight.shape)),
                        C.ERR_SHAPE)
    H, V = int(hidden.shape[-1]), int(weight.shape[0])
    if int(weight.shape[1]) != H:
        raise XentError("%s: weight shape %s does not match hidden's H = "
                        "%d (weight is [V, H])"
                        % (fn, tuple(weight.shape), H), C.ERR_SHAPE)
    if bias is not None and tuple(bias.shape) != (V,):
        raise XentError("%s: bias shape %s must be [V] = (%d,)"
                        % (fn, tuple(bias.shape), V), C.ERR_SHAPE)
    batch_shape = tuple(hidden.shape[:-1])
    if labels is not None:
        check_labels(fn, labels, batch_shape)
    return batch_shape, H, V


def check_chunk_rows(fn, chunk_rows):
    chunk_rows = C._int("chunk_rows", chunk_rows, 62)
    if chunk_rows < 0:
        raise XentError("%s: chunk_rows = %d must be >= 0 (0: default)"
                        % (fn, chunk_rows), C.ERR_VALUE)
    return chunk_rows


def check_reduction(fn, reduction):
    if reduction not in C.REDUCTIONS:
        raise XentError("%s: reduction = %r: must be one of 'none', 'sum', "
                        "'mean'" % (fn, reduction), C.ERR_VALUE)


# --- backends ----------------------------------------------------------------


class _Backend:
    """Where a call's kernels run: the CPU (xent_*) or the tensors' CUDA
    device (xent_cuda_*, torch's current stream: _torch.CudaBackend)."""

    def __init__(self, fn, device):
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            if not _torch.cuda_available():
                raise XentTypeError("%s: the tensors are on %s but this build"
                                    " of libxent (%s) has no CUDA kernels, "
                                    "or torch sees no GPU"
                                    % (fn, device, C.version()))
            self.impl = _torch.CudaBackend(device)
            self.chunk_bytes = CHUNK_BYTES_CUDA
        else:
            self.impl = _torch.Backend(device)
            self.chunk_bytes = CHUNK_BYTES

    def call(self, name, *args):
        self.impl.call(name, *args)

    @contextlib.contextmanager
    def unchecked(self):
        """CUDA: the calls inside run with the label check off (labels
        checked before; no synchronization)."""
        if not self.cuda:
            yield
            return
        check = C.LIB.fn("xent_cuda_set_label_check")
        prev = check(0)
        try:
            yield
        finally:
            check(prev)

    def comm_device(self, group):
        """Where the collectives run: the device under NCCL (and the other
        device backends), the CPU under gloo or for CPU tensors."""
        if not self.cuda:
            return self.device
        import torch.distributed as dist
        return torch.device("cpu") if dist.get_backend(group) == "gloo" \
            else self.device


def _no_autocast(device):
    """The head's products stay fp32 inside an autocast region."""
    return torch.autocast(device.type, enabled=False)


class _Head:
    """hidden [T, H], the rank's weight [V, H] / bias [V], labels [T], the
    vocabulary blocks and the process group of one call."""

    def __init__(self, fn, hidden, weight, bias, labels, group, vocab_start,
                 vocab_total, vocab_block, chunk_rows, device_type="cpu"):
        self.batch_shape, H, V = check_inputs(fn, hidden, weight, bias,
                                              labels, device_type)
        self.fn = fn
        self.dev = hidden.device
        self.backend = _Backend(fn, self.dev)
        self.hidden = hidden.reshape(-1, H)
        self.weight, self.bias = weight, bias
        self.T, self.H, self.V = int(self.hidden.shape[0]), H, V
        self._w32 = None
        self.labels = None if labels is None else \
            check_labels(fn, labels, self.batch_shape)
        self.group = group
        self.rows = _chunk_rows(chunk_rows, self.T, V,
                                self.backend.chunk_bytes)
        self._layout(vocab_start, vocab_total, vocab_block)

    def empty(self, *shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device=self.dev)

    def zeros(self, *shape, dtype=torch.float32):
        return torch.zeros(shape, dtype=dtype, device=self.dev)

    # --- vocabulary layout -------------------------------------------------

    def _layout(self, vocab_start, vocab_total, vocab_block):
        """self.blocks: the rank's column blocks [(a, b)] (local indices);
        self.v0 / self.total: global start of column 0 and the whole V;
        self.order: for the gathered [S, nmax] partial slots, the global
        column order (list of (rank, k)); self.nmax."""
        V = self.V
        if vocab_block is not None:
            vocab_block = C._int("vocab_block", vocab_block, 62)
            if vocab_block < 1:
                raise XentError("%s: vocab_block = %d must be >= 1"
                                % (self.fn, vocab_block), C.ERR_VALUE)
        if self.group is None:
            self.v0 = C._int("vocab_start", vocab_start, 62)
            if self.v0 != 0 or (vocab_total not in (None, 0, V)):
                raise XentError("%s: vocab_start / vocab_total need a "
                                "process_group (the chunked head's shards "
                                "are ranks)" % self.fn, C.ERR_VALUE)
            self.total = V
            self.blocks = _split(0, V, vocab_block)
            self.order = [(0, k) for k in range(len(self.blocks))]
            self.nmax = len(self.blocks)
            return
        import torch.distributed as dist
        S = dist.get_world_size(self.group)
        self.v0 = C._int("vocab_start", vocab_start, 62)
        meta = torch.tensor([self.v0, V], dtype=torch.int64,
                            device=self.backend.comm_device(self.group))
        metas = [torch.empty_like(meta) for _ in range(S)]
        dist.all_gather(metas, meta, group=self.group)
        spans = [(int(m[0]), int(m[0]) + int(m[1])) for m in metas]
        total = max(b for _, b in spans)
        if vocab_total not in (None, 0) and int(vocab_total) != total:
            raise XentError("%s: vocab_total = %d but the ranks' shards end "
                            "at %d" % (self.fn, int(vocab_total), total),
                            C.ERR_VALUE)
        cover = sorted(spans)
        pos = 0
        for a, b in cover:
            if a != pos:
                raise XentError("%s: the ranks' shards %s do not tile [0, %d)"
                                " (check vocab_start)" % (self.fn, cover,
                                                          total), C.ERR_VALUE)
            pos = b
        self.total = total
        per_rank = [[(a + x, a + y) for x, y in _split(a, b, vocab_block,
                                                        local=True)]
                    for a, b in spans]
        self.blocks = [(x - self.v0, y - self.v0)
                       for x, y in per_rank[dist.get_rank(self.group)]]
        self.nmax = max(len(p) for p in per_rank)
        slots = [(blk[0], r, k) for r, p in enumerate(per_rank)
                 for k, blk in enumerate(p)]
        self.order = [(r, k) for _, r, k in sorted(slots)]

    # --- pieces -------------------------------------------------------------

    def w32(self, a, b):
        """fp32 weight rows a:b: a view of an fp32 weight; else on the CPU
        one fp32 copy made once, on CUDA the block converted on each use
        (no fp32 copy of a whole bf16 weight on the device)."""
        w = self.weight.detach()
        if w.dtype == torch.float32:
            return w[a:b]
        if self.backend.cuda:
            return w[a:b].float()
        if self._w32 is None:
            self._w32 = w.float()
        return self._w32[a:b]

    def logits(self, r0, r1, a, b):
        """fp32 logits [r1 - r0, b - a] of rows r0:r1, local columns a:b."""
        h = self.hidden[r0:r1].detach()
        if h.dtype != torch.float32:
            h = h.float()
        w = self.w32(a, b)
        if self.bias is None:
            return torch.mm(h, w.t())
        bb = self.bias.detach()[a:b].float()
        return torch.addmm(bb, h, w.t())

    def inp(self, z, r0, r1, grad_rows=None):
        i = C.CeInput()
        i.logits = z.data_ptr()
        i.dtype = C.F32
        i.T, i.V, i.ld = r1 - r0, int(z.shape[1]), int(z.shape[1])
        if self.labels is not None:
            i.labels = self.labels.data_ptr() + \
                r0 * self.labels.element_size()
            i.label_dtype = C.I32 if self.labels.dtype == torch.int32 \
                else C.I64
        if grad_rows is not None:
            i.grad_rows = grad_rows.data_ptr() + 4 * r0
        return i

    def full_inp(self):
        i = C.CeInput()
        i.dtype = C.F32
        i.T, i.V, i.ld = self.T, self.total, self.total
        if self.labels is not None:
            i.labels = self.labels.data_ptr()
            i.label_dtype = C.I32 if self.labels.dtype == torch.int32 \
                else C.I64
        return i

    def block_opts(self, opts, a):
        o = C.make_opts(**opts)
        o.vocab_start = self.v0 + a
        o.vocab_total = self.total
        return o

    # --- forward -------------------------------------------------------------

    def forward(self, opts, reduction, want_lp=False, want_ent=False,
                want_lse=False):
        """Loss ([T] or [1]), stats [T, 2] float64, count [1] int64,
        nonfinite [1], and the requested per-row outputs."""
        with _no_autocast(self.dev):
            return self._forward(opts, reduction, want_lp, want_ent,
                                 want_lse)

    def check_labels_once(self, opts):
        """CUDA: every label in [0, total) or ignore_index, checked here
        once (one synchronization) so that the kernels run unchecked; not
        under graph capture (a bad label then gives NaN rows)."""
        if not self.backend.cuda or self.labels is None or \
                torch.cuda.is_current_stream_capturing():
            return
        ign = int(opts.get("ignore_index", -100))
        y = self.labels
        bad = (y != ign) & ((y < 0) | (y >= self.total))
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0, 0])
            raise XentError("%s: labels[%d] = %d is outside [0, %d) and not "
                            "ignore_index (%d)" % (self.fn, i, int(y[i]),
                                                   self.total, ign),
                            C.ERR_LABEL)

    def _forward(self, opts, reduction, want_lp, want_ent, want_lse):
        T = self.T
        self.check_labels_once(opts)
        be = self.backend
        part = self.empty(self.nmax, T, C.PARTIAL_WORDS, dtype=torch.int64)
        for r0 in range(0, T, self.rows):
            r1 = min(T, r0 + self.rows)
            for k, (a, b) in enumerate(self.blocks):
                z = self.logits(r0, r1, a, b)
                i = self.inp(z, r0, r1)
                o = self.block_opts(opts, a)
                with be.unchecked():
                    be.call("ce_shard_stats", ctypes.byref(i),
                            ctypes.byref(o),
                            ctypes.c_void_p(part[k].data_ptr() +
                                            r0 * 8 * C.PARTIAL_WORDS))
                del z
        if self.group is not None:
            import torch.distributed as dist
            S = dist.get_world_size(self.group)
            cd = be.comm_device(self.group)
            src = part.to(cd)
            bufs = [torch.empty_like(src) for _ in range(S)]
            dist.all_gather(bufs, src, group=self.group)
            parts = torch.stack([bufs[r][k] for r, k in self.order]) \
                .to(self.dev)
            del bufs, src
        else:
            parts = part
        parts = parts.contiguous()
        loss = self.empty(T if reduction == "none" else 1)
        stats = self.empty(T, C.STATS_DOUBLES, dtype=torch.float64)
        counts = self.zeros(2, dtype=torch.int64)
        lp = self.empty(T) if want_lp else None
        ent = self.empty(T) if want_ent else None
        lse = self.empty(T) if want_lse else None
        out = C.CeOutput()
        out.loss, out.stats = loss.data_ptr(), stats.data_ptr()
        out.logprob = None if lp is None else lp.data_ptr()
        out.entropy = None if ent is None else ent.data_ptr()
        out.lse = None if lse is None else lse.data_ptr()
        out.n_counted = counts.data_ptr()
        out.n_nonfinite = counts.data_ptr() + 8
        o = C.make_opts(**opts)
        o.vocab_total = self.total
        fi = self.full_inp()
        with be.unchecked():
            be.call("ce_combine", ctypes.c_void_p(parts.data_ptr()),
                    ctypes.c_int(int(parts.shape[0])), ctypes.byref(fi),
                    ctypes.byref(o), ctypes.byref(out))
        return dict(loss=loss, stats=stats, counts=counts, lp=lp, ent=ent,
                    lse=lse)

    # --- backward ------------------------------------------------------------

    def backward(self, opts, stats, want, grad_scale=1.0, grad_rows=None,
                 ent=None, g_lp=None, g_ent=None, wbuf=None):
        """Gradients of (hidden, weight, bias) as wanted. The weight's goes
        into wbuf (fp32 [V, H], added to) when given, else a fresh fp32
        buffer. Cross-entropy: opts (with reduction / normalizer) and
        grad_scale or grad_rows. Log-probs: g_lp [T] (d/d logprob), g_ent
        [T] (d/d entropy; float64 formula), ent the forward's entropy."""
        with _no_autocast(self.dev), self.backend.unchecked():
            return self._backward(opts, stats, want, grad_scale, grad_rows,
                                  ent, g_lp, g_ent, wbuf)

    def _backward(self, opts, stats, want, grad_scale, grad_rows, ent, g_lp,
                  g_ent, wbuf):
        want_h, want_w, want_b = want
        be = self.backend
        T, H = self.T, self.H
        hdt = self.hidden.dtype
        multi = len(self.blocks) > 1 or self.group is not None
        gh = None
        if want_h:
            gh = self.zeros(T, H, dtype=torch.float64) if multi else \
                self.empty(T, H, dtype=hdt)
        gw = None
        if want_w:
            gw = wbuf if wbuf is not None else self.zeros(self.V, H)
        gb = self.zeros(self.V, dtype=torch.float64) if want_b and \
            self.bias is not None else None
        if gh is None and gw is None and gb is None:
            return None, None, None
        ent_path = g_ent is not None
        if g_lp is not None and not ent_path:
            # d(logprob) = -d(nll): the kernel's reduction-none backward
            grad_rows = (-g_lp).to(torch.float32).contiguous()
        elif grad_rows is not None:
            grad_rows = grad_rows.to(torch.float32).contiguous()
        for r0 in range(0, T, self.rows):
            r1 = min(T, r0 + self.rows)
            hc = None
            for k, (a, b) in enumerate(self.blocks):
                z = self.logits(r0, r1, a, b)
                if ent_path:
                    z = self._ent_grad(z, r0, r1, a, opts, stats, ent, g_lp,
                                       g_ent)
                else:
                    i = self.inp(z, r0, r1, grad_rows)
                    o = self.block_opts(opts, a)
                    o.grad_scale = float(grad_scale)
                    be.call("ce_backward", ctypes.byref(i), ctypes.byref(o),
                            ctypes.c_void_p(stats.data_ptr() + 16 * r0),
                            ctypes.c_void_p(z.data_ptr()),
                            ctypes.c_int(C.F32), ctypes.c_int64(b - a))
                if gh is not None:
                    d = torch.mm(z, self.w32(a, b))
                    if multi:
                        gh[r0:r1] += d.double()
                    else:
                        gh[r0:r1] = d
                if gw is not None:
                    if hc is None:
                        hc = self.hidden[r0:r1].detach().float()
                    gw[a:b].addmm_(z.t(), hc)
                if gb is not None:
                    gb[a:b] += z.double().sum(0)
                del z
        if gh is not None and self.group is not None:
            import torch.distributed as dist
            cd = be.comm_device(self.group)
            g = gh.to(cd)
            dist.all_reduce(g, group=self.group)
            if g is not gh:
                gh.copy_(g)
        return gh, gw, gb

    def _ent_grad(self, z, r0, r1, a, opts, stats, ent, g_lp, g_ent):
        """dL/dz of L = sum g_lp * logprob + g_ent * entropy over the chunk's
        block, in float64, rounded once to fp32 (returned)."""
        z = z.double()
        tau = float(opts.get("temperature") or 1.0)
        cap = float(opts.get("softcap") or 0.0)
        if cap > 0:
            th = torch.tanh(z / cap)
            zt = cap * th / tau
            dcap = (1 - th * th) / tau
        else:
            zt = z / tau
            dcap = None
        st = stats[r0:r1]
        logp = zt - st[:, 0:1]
        p = torch.exp(logp)
        Hr = ent[r0:r1].double()[:, None]
        ge = g_ent[r0:r1].double()[:, None]
        d = -ge * p * (logp + Hr)
        if g_lp is not None and self.labels is not None:
            lab = self.labels[r0:r1].to(torch.int64)
            counted = lab != int(opts.get("ignore_index", -100))
            # ignored rows have logprob 0: no gradient through it
            gl = torch.where(counted, g_lp[r0:r1].double(), 0.0)
            d -= gl[:, None] * p
            width = int(z.shape[1])
            if width > 0:
                # the target column of the rows whose target is in this
                # block, written with a scatter (no host synchronization)
                y = lab - (self.v0 + a)
                own = counted & (y >= 0) & (y < width)
                yc = y.clamp(0, width - 1)[:, None]
                nll = st[:, 1]
                # p_t - 1 = expm1(-nll) with full relative accuracy
                new = -gl * torch.expm1(-nll) \
                    - ge[:, 0] * torch.exp(-nll) * (-nll + Hr[:, 0])
                cur = d.gather(1, yc)[:, 0]
                d.scatter_(1, yc, torch.where(own, new, cur)[:, None])
        if dcap is not None:
            d = d * dcap
        else:
            d = d / tau
        return d.float()


def _split(a, b, block, local=False):
    """[a, b) into pieces that start at global multiples of block (None:
    one piece). Returned relative to a when local, else as given."""
    if block is None or b - a <= 0:
        cuts = [(a, b)]
    else:
        cuts, x = [], a
        while x < b:
            y = min(b, (x // block + 1) * block)
            cuts.append((x, y))
            x = y
    if local:
        return [(x - a, y - a) for x, y in cuts]
    return cuts


# --- grad accumulation -----------------------------------------------------


def _weight_buffer(weight, grad_accum, fn):
    """The fp32 [V, H] buffer dweight is added into (grad_accum set), or
    None (a fresh buffer, handed to autograd)."""
    if grad_accum is None:
        return None
    if grad_accum == "main_grad":
        buf = getattr(weight, "main_grad", None)
        if buf is None:
            buf = torch.zeros(weight.shape, dtype=torch.float32,
                              device=weight.device)
            weight.main_grad = buf
    else:                                   # fp32_grad
        buf = weight.grad
        if buf is None:
            if weight.dtype != torch.float32 and \
                    getattr(weight, "grad_dtype", None) != torch.float32:
                try:
                    weight.grad_dtype = torch.float32
                except (AttributeError, RuntimeError, TypeError) as e:
                    raise XentError("%s: grad_accum='fp32_grad' with a %s "
                                    "weight needs torch's Tensor.grad_dtype "
                                    "(%s)" % (fn, weight.dtype, e),
                                    C.ERR_VALUE) from None
            buf = torch.zeros(weight.shape, dtype=torch.float32,
                              device=weight.device)
            weight.grad = buf
    if buf.dtype != torch.float32 or tuple(buf.shape) != \
            tuple(weight.shape) or not buf.is_contiguous() or \
            buf.device != weight.device:
        raise XentError("%s: grad_accum=%r: the buffer must be a contiguous "
                        "float32 tensor of the weight's shape %s on its "
                        "device %s, got %s %s on %s"
                        % (fn, grad_accum, tuple(weight.shape), weight.device,
                           buf.dtype, tuple(buf.shape), buf.device),
                        C.ERR_VALUE)
    return buf


# --- autograd ----------------------------------------------------------------


class _Cfg:
    pass


class _LinearCE(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden, weight, bias, cfg):
        head = _head(cfg, hidden, weight, bias)
        res = head.forward(cfg.opts, cfg.reduction, want_lse=cfg.return_stats)
        ctx.cfg, ctx.head = cfg, head
        ctx.stats, ctx.counts = res["stats"], res["counts"]
        ctx.hshape = tuple(hidden.shape)
        loss = res["loss"]
        loss = loss.view(head.batch_shape) if cfg.reduction == "none" \
            else loss.view(())
        if not cfg.return_stats:
            return loss
        lse = res["lse"].view(head.batch_shape)
        c = res["counts"]
        extra = (lse, c[0].clone(), c[1].clone())
        ctx.mark_non_differentiable(*extra)
        return (loss,) + extra

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g, *unused):
        cfg, head = ctx.cfg, ctx.head
        want = (ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                ctx.needs_input_grad[2])
        opts = dict(cfg.opts)
        kw = {}
        if cfg.reduction == "none":
            kw["grad_rows"] = g.reshape(-1)
        else:
            kw["grad_scale"] = float(g)
            if cfg.reduction == "mean" and not opts.get("normalizer"):
                # the whole call's count (a chunk's backward would use its
                # own): the same double division as the unfused kernel
                count = int(ctx.counts[0])
                opts["normalizer"] = float(count)
                if count == 0:
                    kw["grad_scale"] = 0.0
                    opts["normalizer"] = 1.0
        return _grads(ctx, head, opts, want, kw)


def _head(cfg, hidden, weight, bias):
    return _Head(cfg.fn, hidden, weight, bias, cfg.labels, cfg.group,
                 cfg.vocab_start, cfg.vocab_total, cfg.vocab_block,
                 cfg.chunk_rows, cfg.device_type)


def _grads(ctx, head, opts, want, kw):
    cfg = ctx.cfg
    wbuf = None
    if want[1] and cfg.grad_accum is not None:
        wbuf = _weight_buffer(cfg.weight_ref, cfg.grad_accum, cfg.fn)
    gh, gw, gb = head.backward(opts, ctx.stats, want, wbuf=wbuf, **kw)
    ctx.head = None
    if gh is not None:
        gh = gh.to(head.hidden.dtype).view(ctx.hshape)
    if gw is not None:
        gw = None if wbuf is not None else gw.to(head.weight.dtype)
    if gb is not None:
        gb = gb.to(head.bias.dtype)
    return gh, gw, gb, None


class _LinearLP(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden, weight, bias, cfg):
        head = _head(cfg, hidden, weight, bias)
        res = head.forward(cfg.opts, "none", want_lp=True,
                           want_ent=cfg.entropy)
        ctx.cfg, ctx.head = cfg, head
        ctx.stats, ctx.ent = res["stats"], res["ent"]
        ctx.hshape = tuple(hidden.shape)
        lp = res["lp"].view(head.batch_shape)
        if cfg.entropy:
            return lp, res["ent"].view(head.batch_shape)
        return lp

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_lp, g_ent=None):
        head = ctx.head
        want = (ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                ctx.needs_input_grad[2])
        kw = dict(g_lp=None if g_lp is None else g_lp.reshape(-1))
        if ctx.cfg.entropy and g_ent is not None and bool((g_ent != 0).any()):
            kw["g_ent"] = g_ent.reshape(-1)
            kw["ent"] = ctx.ent
            if kw["g_lp"] is None:
                kw["g_lp"] = head.zeros(head.T)
        elif kw["g_lp"] is None:
            return None, None, None, None
        return _grads(ctx, head, dict(ctx.cfg.opts), want, kw)


# --- public ------------------------------------------------------------------


def _check_accum(fn, grad_accum):
    if grad_accum not in GRAD_ACCUM:
        raise XentError("%s: grad_accum = %r: must be None, 'main_grad' or "
                        "'fp32_grad'" % (fn, grad_accum), C.ERR_VALUE)


def _cfg(fn, labels, opts, chunk_rows, grad_accum, weight, process_group,
         vocab_start, vocab_total, vocab_block, device_type):
    _check_accum(fn, grad_accum)
    C.make_opts(**opts)               # early check of the option values
    chunk_rows = check_chunk_rows(fn, chunk_rows)
    cfg = _Cfg()
    cfg.device_type = device_type
    cfg.fn, cfg.labels, cfg.opts = fn, labels, opts
    cfg.chunk_rows, cfg.grad_accum, cfg.weight_ref = chunk_rows, \
        grad_accum, weight
    cfg.group, cfg.vocab_start = process_group, vocab_start
    cfg.vocab_total, cfg.vocab_block = vocab_total, vocab_block
    return cfg


def linear_cross_entropy(hidden, weight, labels, bias=None, *,
                         ignore_index=-100, reduction="mean", normalizer=None,
                         temperature=1.0, softcap=0.0, z_loss=0.0,
                         label_smoothing=0.0, return_stats=False,
                         chunk_rows=0, grad_accum=None, process_group=None,
                         vocab_start=0, vocab_total=None, vocab_block=None,
                         threads=0, _device_type="cpu"):
    """The chunked fused head (module docstring): CPU tensors, or CUDA
    tensors with _device_type='cuda' (from xent/_linear.py)."""
    fn = "xent.linear_cross_entropy"
    check_reduction(fn, reduction)
    opts = dict(ignore_index=ignore_index, reduction=reduction,
                normalizer=normalizer, temperature=temperature,
                softcap=softcap, z_loss=z_loss,
                label_smoothing=label_smoothing, threads=threads)
    if not isinstance(labels, torch.Tensor):
        raise XentTypeError("%s: labels must be a torch.Tensor, got %s"
                            % (fn, type(labels).__name__))
    cfg = _cfg(fn, labels, opts, chunk_rows, grad_accum, weight,
               process_group, vocab_start, vocab_total, vocab_block,
               _device_type)
    cfg.reduction, cfg.return_stats = reduction, bool(return_stats)
    res = _LinearCE.apply(hidden, weight, bias, cfg)
    if not return_stats:
        return res
    loss, lse, n_counted, n_nonfinite = res
    return loss, dict(lse=lse, n_counted=n_counted, n_nonfinite=n_nonfinite)


def linear_logprobs(hidden, weight, labels, bias=None, *, temperature=1.0,
                    softcap=0.0, entropy=False, ignore_index=-100,
                    chunk_rows=0, grad_accum=None, process_group=None,
                    vocab_start=0, vocab_total=None, vocab_block=None,
                    threads=0, _device_type="cpu"):
    """Per-token log p(label) (and the entropy), differentiable in both;
    CPU tensors, or CUDA tensors with _device_type='cuda'."""
    fn = "xent.linear_logprobs"
    if not isinstance(labels, torch.Tensor):
        raise XentTypeError("%s: labels must be a torch.Tensor, got %s"
                            % (fn, type(labels).__name__))
    opts = dict(ignore_index=ignore_index, reduction="none",
                temperature=temperature, softcap=softcap, threads=threads)
    cfg = _cfg(fn, labels, opts, chunk_rows, grad_accum, weight,
               process_group, vocab_start, vocab_total, vocab_block,
               _device_type)
    cfg.entropy = bool(entropy)
    return _LinearLP.apply(hidden, weight, bias, cfg)
