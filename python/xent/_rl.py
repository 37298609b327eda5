"""RL loss math (include/xent/rl.h, docs/rl.md) on NumPy arrays and torch
tensors: group advantages, batch normalisation, policy losses with their
gradient, KL estimators, diagnostics and log-prob checks.

Every convention is a keyword whose default is the C default
(xent_rl_*_opts_init). Inputs are converted to what the C calls take
(float32 values, int64 offsets / ids, uint8 masks); outputs are new arrays
(or `out=` arrays) written only when the call succeeds. torch tensors on the
CPU call xent_rl_*; CUDA tensors call xent_cuda_rl_* on torch's current
stream (each such call synchronizes that stream, see docs/rl.md "CUDA").
"""
import ctypes
import sys

import numpy as np

from . import _capi as C
from ._capi import XentError, XentTypeError

STD = {"population": 0, "sample": 1, "none": 2}
BATCH = {"mean_abs": 0, "std": 1}
LOSS = {"ppo": 0, "cispo": 1, "gspo": 2, "reinforce": 3}
AGG = {"token_sum": 0, "seq_mean_token_mean": 1, "seq_mean_token_sum": 2}
TIS = {None: 0, "off": 0, "token": 1, "sequence": 2, "geometric": 3}
TIS_MODE = {"truncate": 0, "mask": 1}
KL = {None: 0, "none": 0, "k1": 1, "k2": 2, "k3": 3}
LAYOUT = {"sequence": 1, "token": 2}


def _choice(name, v, table):
    try:
        if v in table:
            return table[v]
    except TypeError:
        pass
    names = ", ".join(repr(k) for k in table)
    raise XentError("%s = %r: must be one of %s" % (name, v, names),
                    C.ERR_VALUE)


def _opt(name, v, default=0.0):
    return default if v is None else C._float(name, v)


def _torch():
    return sys.modules.get("torch")


def _is_tensor(x):
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


# --------------------------------------------------------------------------
# Array back ends: NumPy, and torch (CPU or CUDA)
# --------------------------------------------------------------------------

class _Numpy:
    """Converts inputs to contiguous NumPy arrays and calls xent_rl_*."""

    def call(self, name, *args):
        C.LIB.call("xent_rl_" + name, *args)

    def asarray(self, x):
        return x if isinstance(x, np.ndarray) else np.asarray(x)

    def kind(self, a):
        """'f' floating, 'i' integer, 'b' bool, else '?'."""
        k = a.dtype.kind
        if k == "f" or a.dtype.name == "bfloat16":
            return "f"
        return {"i": "i", "u": "i", "b": "b"}.get(k, "?")

    def convert(self, a, dtype):
        return np.ascontiguousarray(a, dtype={"f32": np.float32,
                                              "i64": np.int64,
                                              "u8": np.uint8}[dtype])

    def empty(self, shape, dtype):
        return np.empty(shape, dtype={"f32": np.float32,
                                      "f64": np.float64}[dtype])

    def ptr(self, a):
        return None if a is None else a.ctypes.data

    def is_out(self, a):
        return isinstance(a, np.ndarray) and a.dtype == np.float32 and \
            a.flags.c_contiguous and a.flags.writeable

    def values(self, a):
        return a

    def arange_offsets(self, nseq, step):
        return np.arange(nseq + 1, dtype=np.int64) * step

    def scalar(self, v):
        return float(v)

    def has_tensor_args(self):
        return False


class _Torch(_Numpy):
    """torch tensors on one device: CPU -> xent_rl_*, CUDA ->
    xent_cuda_rl_* with the current stream."""

    def __init__(self, device):
        self.torch = _torch()
        self.device = device
        self.cuda = device.type == "cuda"
        if device.type not in ("cpu", "cuda"):
            raise XentTypeError("tensors on device %s are not supported "
                                "(cpu, cuda)" % device)
        if self.cuda and not C.LIB.has("xent_cuda_rl_policy_loss"):
            raise XentTypeError("tensors are on %s but this libxent (%s) has "
                                "no CUDA support; move them to the CPU"
                                % (device, C.version()))

    def call(self, name, *args):
        if not self.cuda:
            return C.LIB.call("xent_rl_" + name, *args)
        torch = self.torch
        with torch.cuda.device(self.device):
            stream = torch.cuda.current_stream(self.device).cuda_stream
            C.LIB.call("xent_cuda_rl_" + name, *(args + (stream,)))

    def asarray(self, x):
        torch = self.torch
        if isinstance(x, torch.Tensor):
            if x.device != self.device:
                raise XentTypeError("a tensor on %s was mixed with tensors "
                                    "on %s: put them on one device"
                                    % (x.device, self.device))
            return x.detach()
        return torch.as_tensor(np.asarray(x), device=self.device)

    def kind(self, a):
        if a.dtype.is_floating_point:
            return "f"
        if a.dtype == self.torch.bool:
            return "b"
        return "?" if a.dtype.is_complex else "i"

    def convert(self, a, dtype):
        torch = self.torch
        want = {"f32": torch.float32, "i64": torch.int64,
                "u8": torch.uint8}[dtype]
        return a.to(dtype=want).contiguous()

    def empty(self, shape, dtype):
        torch = self.torch
        return torch.empty(shape, device=self.device,
                           dtype={"f32": torch.float32,
                                  "f64": torch.float64}[dtype])

    def ptr(self, a):
        if a is None:
            return None
        return a.data_ptr() or None

    def is_out(self, a):
        return isinstance(a, self.torch.Tensor) and \
            a.dtype == self.torch.float32 and a.is_contiguous() and \
            a.device == self.device

    def values(self, a):
        return a.cpu().numpy()

    def arange_offsets(self, nseq, step):
        return self.torch.arange(0, nseq + 1, device=self.device,
                                 dtype=self.torch.int64) * step

    def scalar(self, v):
        return self.torch.tensor(float(v), dtype=self.torch.float32,
                                 device=self.device)


def _backend(*xs):
    """The torch back end on the first tensor's device, else NumPy."""
    for x in xs:
        if _is_tensor(x):
            return _Torch(x.device)
    return _Numpy()


def _values(be, x, name, allow_int):
    """float32 contiguous copy/view of a value array (rewards, advantages:
    allow_int; log-probs: floating only)."""
    a = be.asarray(x)
    k = be.kind(a)
    if k == "?" or (not allow_int and k != "f"):
        raise XentTypeError("%s has dtype %s: expected a floating-point "
                            "array%s" % (name, a.dtype, "" if not allow_int
                                         else " (or integers / bools)"))
    return be.convert(a, "f32")


def _index(be, x, name):
    a = be.asarray(x)
    if be.kind(a) != "i":
        raise XentTypeError("%s has dtype %s: expected integers (int64)"
                            % (name, a.dtype))
    if a.ndim != 1:
        raise XentError("%s must be 1-D, got shape %s"
                        % (name, tuple(a.shape)), C.ERR_SHAPE)
    return be.convert(a, "i64")


def _mask(be, x, shape, name="mask"):
    """uint8 0/1 mask of `shape` (bool or integer input; other values are
    reported by the library with their index)."""
    if x is None:
        return None
    a = be.asarray(x)
    if tuple(a.shape) != tuple(shape):
        raise XentError("%s shape %s does not match the log-probs' shape %s"
                        % (name, tuple(a.shape), tuple(shape)), C.ERR_SHAPE)
    if be.kind(a) not in ("b", "i"):
        raise XentTypeError("%s has dtype %s: use bool or uint8 (0 / 1)"
                            % (name, a.dtype))
    if be.kind(a) == "i" and str(a.dtype) not in ("uint8", "torch.uint8"):
        bad = np.flatnonzero((be.values(a).reshape(-1) != 0) &
                             (be.values(a).reshape(-1) != 1))
        if bad.size:
            i = int(bad[0])
            raise XentError("%s[%d] = %d: a mask holds 0 or 1"
                            % (name, i, int(be.values(a).reshape(-1)[i])),
                            C.ERR_VALUE)
    return be.convert(a, "u8")


def _same_shape(a, shape, name, what="new_logprobs"):
    if tuple(a.shape) != tuple(shape):
        raise XentError("%s shape %s does not match %s shape %s"
                        % (name, tuple(a.shape), what, tuple(shape)),
                        C.ERR_SHAPE)


def _out(be, out, shape, name="out"):
    if out is None:
        return be.empty(shape, "f32")
    if not be.is_out(out) or tuple(out.shape) != tuple(shape):
        raise XentError("%s must be a writeable contiguous float32 array of "
                        "shape %s on the inputs' device"
                        % (name, tuple(shape)), C.ERR_SHAPE)
    return out


def _struct_dict(s, skip=()):
    return {f: getattr(s, f) for f, _ in s._fields_ if f not in skip}


class _Seqs:
    """Token layout of log-probs: [T] with offsets [nseq + 1] (or one
    sequence), or [B, S] with each row a sequence."""

    def __init__(self, be, lp, offsets):
        self.shape = tuple(lp.shape)
        if lp.ndim == 2 and offsets is None:
            B, S = self.shape
            self.T, self.nseq = B * S, B
            self.offsets = be.arange_offsets(B, S)
        elif lp.ndim == 1:
            self.T = self.shape[0]
            if offsets is None:
                self.nseq = 1
                self.offsets = be.convert(be.asarray([0, self.T]), "i64")
            else:
                self.offsets = _index(be, offsets, "offsets")
                if self.offsets.shape[0] < 1:
                    raise XentError("offsets must hold nseq + 1 >= 1 entries",
                                    C.ERR_SHAPE)
                self.nseq = self.offsets.shape[0] - 1
        else:
            raise XentError("log-probs must be [T] (with offsets) or [B, S] "
                            "(each row a sequence), got shape %s%s"
                            % (self.shape, " with offsets" if offsets
                               is not None else ""), C.ERR_SHAPE)


# --------------------------------------------------------------------------
# Group advantages and batch normalisation
# --------------------------------------------------------------------------

def group_advantages(rewards, group_ids=None, offsets=None, *, ngroups=None,
                     std="population", eps=1e-6, subtract_mean=True,
                     out=None):
    """Per-group normalised advantages (xent_rl_group_advantages).

    rewards [n] with group_ids [n] (non-decreasing, in [0, ngroups);
    ngroups defaults to max(group_ids) + 1) or offsets [ngroups + 1]; or
    rewards [G, K] with neither: each row is a group. std: 'population'
    (divide by n), 'sample' (n - 1) or 'none' (no scaling). A group whose
    rewards are all equal gets exactly 0 (subtract_mean=True).
    Returns (advantages: float32 of rewards' shape, info dict: n_groups,
    n_zero_var, n_singleton, n_empty, group_mean, group_std [ngroups]
    float64). out= (may be the rewards array) receives the advantages."""
    be = _backend(rewards, group_ids, offsets)
    r = _values(be, rewards, "rewards", allow_int=True)
    opts = C.RlAdvOpts()
    C.LIB.fn("xent_rl_adv_opts_init")(ctypes.byref(opts))
    opts.std = _choice("std", std, STD)
    opts.eps = C._float("eps", eps)
    opts.subtract_mean = C._int("subtract_mean", subtract_mean, 31)
    g = C.RlGroups()
    g.n = int(np.prod(r.shape, dtype=np.int64))
    ids = offs = None
    if group_ids is not None and offsets is not None:
        raise XentError("give group_ids or offsets, not both", C.ERR_VALUE)
    if group_ids is not None or offsets is not None:
        if r.ndim != 1:
            raise XentError("rewards must be 1-D with group_ids / offsets, "
                            "got shape %s" % (tuple(r.shape),), C.ERR_SHAPE)
    if group_ids is not None:
        ids = _index(be, group_ids, "group_ids")
        _same_shape(ids, r.shape, "group_ids", "rewards")
        if ngroups is None:
            ngroups = int(be.values(ids).max()) + 1 if g.n else 0
        g.ngroups = C._int("ngroups", ngroups, 62)
    elif offsets is not None:
        offs = _index(be, offsets, "offsets")
        if offs.shape[0] < 1:
            raise XentError("offsets must hold ngroups + 1 >= 1 entries",
                            C.ERR_SHAPE)
        g.ngroups = offs.shape[0] - 1
    elif r.ndim == 2:
        G, K = r.shape
        offs = be.arange_offsets(G, K)
        g.ngroups = G
    else:
        raise XentError("rewards of shape %s: give group_ids or offsets, or "
                        "a [groups, group_size] array" % (tuple(r.shape),),
                        C.ERR_VALUE)
    g.ids, g.offsets = be.ptr(ids), be.ptr(offs)
    adv = _out(be, out, r.shape)
    gmean = be.empty(g.ngroups, "f64")
    gstd = be.empty(g.ngroups, "f64")
    st = C.RlAdvStats()
    be.call("group_advantages", be.ptr(r), ctypes.byref(g),
            ctypes.byref(opts), be.ptr(adv), be.ptr(gmean), be.ptr(gstd),
            ctypes.byref(st))
    info = _struct_dict(st)
    info["group_mean"], info["group_std"] = gmean, gstd
    return adv, info


def batch_normalize(advantages, mask=None, *, kind="mean_abs",
                    std="population", subtract_mean=False, eps=0.0,
                    out=None):
    """Batch (pack) normalisation (xent_rl_batch_normalize) over the counted
    entries: kind 'mean_abs': A / (mean|A| + eps); 'std':
    (A [- mean]) / (std + eps) with std 'population' or 'sample'. A zero
    scale divides nothing (an all-zero pack stays 0, degenerate=True).
    Returns (normalised float32 array, info dict: n_counted, mean, scale,
    degenerate)."""
    be = _backend(advantages, mask)
    a = _values(be, advantages, "advantages", allow_int=True)
    m = _mask(be, mask, a.shape)
    opts = C.RlBatchOpts()
    C.LIB.fn("xent_rl_batch_opts_init")(ctypes.byref(opts))
    opts.kind = _choice("kind", kind, BATCH)
    opts.std = _choice("std", std, STD)
    opts.subtract_mean = C._int("subtract_mean", subtract_mean, 31)
    opts.eps = C._float("eps", eps)
    res = _out(be, out, a.shape)
    st = C.RlBatchStats()
    n = int(np.prod(a.shape, dtype=np.int64))
    be.call("batch_normalize", be.ptr(a), n, be.ptr(m), ctypes.byref(opts),
            be.ptr(res), ctypes.byref(st))
    info = _struct_dict(st)
    info["degenerate"] = bool(st.degenerate)
    return res, info


# --------------------------------------------------------------------------
# Policy losses, KL, diagnostics, checks
# --------------------------------------------------------------------------

def _loss_opts(*, loss="ppo", eps_low=0.2, eps_high=0.2, dual_clip=None,
               log_ratio_clamp=20.0, agg="token_sum", token_norm=None,
               seq_norm=None, tis=None, tis_mode="truncate", tis_cap=2.0,
               kl=None, kl_coef=0.0, zero_run_limit=32):
    o = C.RlLossOpts()
    C.LIB.fn("xent_rl_loss_opts_init")(ctypes.byref(o))
    o.loss = _choice("loss", loss, LOSS)
    o.eps_low = C._float("eps_low", eps_low)
    o.eps_high = C._float("eps_high", eps_high)
    o.dual_clip = _opt("dual_clip", dual_clip)
    o.log_ratio_clamp = C._float("log_ratio_clamp", log_ratio_clamp)
    o.agg = _choice("agg", agg, AGG)
    o.token_norm = _opt("token_norm", token_norm)
    o.seq_norm = _opt("seq_norm", seq_norm)
    o.tis = _choice("tis", tis, TIS)
    o.tis_mode = _choice("tis_mode", tis_mode, TIS_MODE)
    o.tis_cap = C._float("tis_cap", tis_cap)
    o.kl = _choice("kl", kl, KL)
    o.kl_coef = C._float("kl_coef", kl_coef)
    o.zero_run_limit = C._int("zero_run_limit", zero_run_limit, 62)
    return o


def _adv_layout(adv, seqs, adv_layout):
    if adv_layout is not None:
        lay = _choice("adv_layout", adv_layout, LAYOUT)
        want = seqs.shape if lay == 2 else (seqs.nseq,)
        _same_shape(adv, want, "advantages (adv_layout=%r)" % adv_layout,
                    "the expected")
        return lay
    tok = tuple(adv.shape) == seqs.shape
    seq = tuple(adv.shape) == (seqs.nseq,)
    if tok and seq:
        raise XentError("advantages of shape %s fit both layouts (one per "
                        "token and one per sequence): pass adv_layout="
                        "'token' or 'sequence'" % (tuple(adv.shape),),
                        C.ERR_VALUE)
    if not (tok or seq):
        raise XentError("advantages shape %s is neither per token %s nor per "
                        "sequence (%d,)" % (tuple(adv.shape), seqs.shape,
                                            seqs.nseq), C.ERR_SHAPE)
    return 2 if tok else 1


def _rl_input(be, new_logprobs, offsets, mask, others):
    """xent_rl_input over converted arrays; others: name -> array or None.
    Returns (input struct, seqs, keep-alive dict)."""
    lp = _values(be, new_logprobs, "new_logprobs", allow_int=False)
    seqs = _Seqs(be, lp, offsets)
    keep = {"lp_new": lp, "offsets": seqs.offsets,
            "mask": _mask(be, mask, seqs.shape)}
    for field, (name, x) in others.items():
        if x is None:
            keep[field] = None
            continue
        keep[field] = _values(be, x, name, allow_int=False)
        _same_shape(keep[field], seqs.shape, name)
    inp = C.RlInput()
    inp.T, inp.nseq = seqs.T, seqs.nseq
    for field in ("offsets", "lp_new", "lp_old", "lp_sampler", "lp_ref",
                  "mask"):
        setattr(inp, field, be.ptr(keep.get(field)))
    return inp, seqs, keep


def policy_loss(new_logprobs, old_logprobs, advantages, *, loss="ppo",
                offsets=None, mask=None, adv_layout=None, eps_low=0.2,
                eps_high=0.2, dual_clip=None, log_ratio_clamp=20.0,
                agg="token_sum", token_norm=None, seq_norm=None,
                sampler_logprobs=None, tis=None, tis_mode="truncate",
                tis_cap=2.0, ref_logprobs=None, kl=None, kl_coef=0.0,
                zero_run_limit=32, grad_out=None):
    """Policy loss and its gradient w.r.t. new_logprobs
    (xent_rl_policy_loss); docs/python.md "RL" lists every keyword.

    Log-probs are [T] (offsets [nseq + 1]; none: one sequence) or [B, S]
    (rows are sequences). advantages per token (the log-probs' shape) or
    per sequence ([nseq]); adv_layout='token'/'sequence' when the shape
    does not say. token_norm / seq_norm have no default: set them to the
    global counts of the optimizer step. Returns (loss, grad, stats): loss
    a float (NumPy) or a 0-d float32 tensor that back-propagates into
    new_logprobs (torch); grad float32 of the log-probs' shape; stats the
    counts of xent_rl_loss_stats plus 'token_loss' (per-token losses)."""
    be = _backend(new_logprobs, old_logprobs, advantages, sampler_logprobs,
                  ref_logprobs)
    opts = _loss_opts(loss=loss, eps_low=eps_low, eps_high=eps_high,
                      dual_clip=dual_clip, log_ratio_clamp=log_ratio_clamp,
                      agg=agg, token_norm=token_norm, seq_norm=seq_norm,
                      tis=tis, tis_mode=tis_mode, tis_cap=tis_cap, kl=kl,
                      kl_coef=kl_coef, zero_run_limit=zero_run_limit)
    inp, seqs, keep = _rl_input(be, new_logprobs, offsets, mask, {
        "lp_old": ("old_logprobs", old_logprobs),
        "lp_sampler": ("sampler_logprobs", sampler_logprobs),
        "lp_ref": ("ref_logprobs", ref_logprobs)})
    adv = _values(be, advantages, "advantages", allow_int=True)
    inp.adv_layout = _adv_layout(adv, seqs, adv_layout)
    inp.advantages = be.ptr(adv)
    grad = _out(be, grad_out, seqs.shape, "grad_out")
    tl = be.empty(seqs.shape, "f32")
    st = C.RlLossStats()
    be.call("policy_loss", ctypes.byref(inp), ctypes.byref(opts),
            be.ptr(tl), be.ptr(grad), ctypes.byref(st))
    stats = _struct_dict(st)
    stats["token_loss"] = tl
    value = _attach(new_logprobs, st.loss, grad) if _is_tensor(grad) \
        else float(st.loss)
    return value, grad, stats


def _attach(new_logprobs, value, grad):
    """A 0-d float32 tensor holding `value`; when new_logprobs requires a
    gradient, backward() adds grad_output * grad into it."""
    torch = _torch()
    if not (isinstance(new_logprobs, torch.Tensor) and
            new_logprobs.requires_grad and torch.is_grad_enabled()):
        return torch.tensor(value, dtype=torch.float32, device=grad.device)
    global _LossFn
    if _LossFn is None:
        _LossFn = _make_loss_fn()
    return _LossFn.apply(new_logprobs, value, grad)


_LossFn = None   # the torch.autograd.Function, made on first use


def _make_loss_fn():
    torch = _torch()

    class LossFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, lp, value, grad):
            ctx.save_for_backward(grad)
            ctx.lp_dtype = lp.dtype
            return torch.tensor(value, dtype=torch.float32, device=lp.device)

        @staticmethod
        def backward(ctx, g):
            (grad,) = ctx.saved_tensors
            return (grad * g).to(ctx.lp_dtype), None, None

    return LossFn


def kl(new_logprobs, ref_logprobs, *, kind, mask=None, log_ratio_clamp=20.0):
    """Per-token KL estimate between the policy and a reference
    (xent_rl_kl_estimate) with d = clamp(ref - new): kind 'k1' (-d), 'k2'
    (d^2 / 2) or 'k3' (e^d - 1 - d). Returns (k, dk/dnew, info dict:
    n_clamped); masked-out tokens hold 0."""
    be = _backend(new_logprobs, ref_logprobs)
    k = _choice("kind", kind, {n: v for n, v in KL.items() if v})
    lp = _values(be, new_logprobs, "new_logprobs", allow_int=False)
    ref = _values(be, ref_logprobs, "ref_logprobs", allow_int=False)
    _same_shape(ref, lp.shape, "ref_logprobs")
    m = _mask(be, mask, lp.shape)
    est, dk = be.empty(lp.shape, "f32"), be.empty(lp.shape, "f32")
    nc = ctypes.c_int64(0)
    be.call("kl_estimate", k, be.ptr(lp), be.ptr(ref),
            int(np.prod(lp.shape, dtype=np.int64)), be.ptr(m),
            C._float("log_ratio_clamp", log_ratio_clamp), be.ptr(est),
            be.ptr(dk), ctypes.byref(nc))
    return est, dk, {"n_clamped": nc.value}


def rl_diagnostics(new_logprobs, old_logprobs=None, sampler_logprobs=None, *,
                   offsets=None, mask=None, eps_low=0.2, eps_high=0.2,
                   log_ratio_clamp=20.0, zero_run_limit=32):
    """Ratio and importance-weight diagnostics in one call
    (xent_rl_diagnostics): a dict of clip_frac_low/high, ratio_min/mean/max,
    ratio_frac_out, n_ratio_clamped, has_weights, ess_frac, chi2,
    mismatch_kl_k1/k3, weight_max, n_weight_clamped, n_tokens. Fields of an
    absent input are 0."""
    be = _backend(new_logprobs, old_logprobs, sampler_logprobs)
    opts = _loss_opts(eps_low=eps_low, eps_high=eps_high,
                      log_ratio_clamp=log_ratio_clamp,
                      zero_run_limit=zero_run_limit)
    inp, _, keep = _rl_input(be, new_logprobs, offsets, mask, {
        "lp_old": ("old_logprobs", old_logprobs),
        "lp_sampler": ("sampler_logprobs", sampler_logprobs)})
    d = C.RlDiag()
    be.call("diagnostics", ctypes.byref(inp), ctypes.byref(opts),
            ctypes.byref(d))
    out = _struct_dict(d)
    out["has_weights"] = bool(d.has_weights)
    return out


def check_logprobs(logprobs, *, name="logprobs", offsets=None, mask=None,
                   allow_neg_inf=False, zero_run_limit=32, raise_on_error=True):
    """Checks one log-prob array (xent_rl_check_logprobs): NaN, > 0, -inf
    (unless allow_neg_inf) and runs of >= zero_run_limit exact zeros in one
    sequence (a zero-filled dump). Returns the report dict (counts, first_*
    indices or -1, 'ok', 'message'); raises XentError naming the first bad
    index unless raise_on_error=False."""
    be = _backend(logprobs, offsets, mask)
    lp = _values(be, logprobs, name, allow_int=False)
    seqs = _Seqs(be, lp, offsets)
    m = _mask(be, mask, seqs.shape)
    rep = C.RlLpReport()
    args = [str(name).encode(), be.ptr(lp), seqs.T, be.ptr(seqs.offsets),
            seqs.nseq, be.ptr(m), C._int("allow_neg_inf", allow_neg_inf, 31),
            C._int("zero_run_limit", zero_run_limit, 62), ctypes.byref(rep)]
    try:
        be.call("check_logprobs", *args)
        err = None
    except XentError as e:
        err = e
    out = _struct_dict(rep)
    out["ok"] = err is None
    out["message"] = "" if err is None else str(err)
    if err is not None and raise_on_error:
        raise err
    return out
