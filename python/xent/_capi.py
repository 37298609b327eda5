"""ctypes mirror of include/xent.h: the shared library, its structs, errors.

The structs below must match the C declarations field for field; the
library reports its own sizes and offsets (xent_abi_sizeof) and
`check_abi()` compares them (python/tests/test_abi.py runs it).
"""
import ctypes
import os
import pathlib

# xent_status (include/xent.h)
OK = 0
ERR_NULL, ERR_SHAPE, ERR_LABEL, ERR_DTYPE = 1, 2, 3, 4
ERR_VALUE, ERR_ALLOC = 5, 6
ERR_IO, ERR_FORMAT, ERR_NOT_FOUND, ERR_CUDA, ERR_UNSUPPORTED = 7, 8, 9, 10, 11
ERR_INTERNAL = 12

# xent_dtype
F32, BF16, F16, F64, I32, I64, U8 = 0, 1, 2, 3, 4, 5, 6
DTYPE_NAMES = {F32: "f32", BF16: "bf16", F16: "f16", F64: "f64",
               I32: "i32", I64: "i64", U8: "u8"}

# xent_reduction
REDUCE_NONE, REDUCE_SUM, REDUCE_MEAN = 0, 1, 2
REDUCTIONS = {"none": REDUCE_NONE, "sum": REDUCE_SUM, "mean": REDUCE_MEAN}


class XentError(ValueError):
    """An error reported by the xent library or found by the binding.

    `status` is the library's xent_status code (0 when the binding itself
    rejected the call before reaching the library)."""

    def __init__(self, message, status=0):
        super().__init__(message)
        self.status = status


class XentTypeError(XentError, TypeError):
    """Wrong dtype or wrong device of an argument."""


c_i64 = ctypes.c_int64
c_dbl = ctypes.c_double
c_int = ctypes.c_int
c_vp = ctypes.c_void_p


class CeOpts(ctypes.Structure):
    _fields_ = [("ignore_index", c_i64), ("reduction", c_int),
                ("normalizer", c_dbl), ("temperature", c_dbl),
                ("softcap", c_dbl), ("z_loss", c_dbl),
                ("label_smoothing", c_dbl), ("grad_scale", c_dbl),
                ("vocab_start", c_i64), ("vocab_total", c_i64),
                ("threads", c_int)]


class CeInput(ctypes.Structure):
    _fields_ = [("logits", c_vp), ("dtype", c_int), ("T", c_i64),
                ("V", c_i64), ("ld", c_i64), ("labels", c_vp),
                ("label_dtype", c_int), ("grad_rows", c_vp)]


class CeStats(ctypes.Structure):
    _fields_ = [("lse", c_dbl), ("nll", c_dbl)]


class CeOutput(ctypes.Structure):
    _fields_ = [("loss", c_vp), ("nll", c_vp), ("logprob", c_vp),
                ("lse", c_vp), ("entropy", c_vp), ("stats", c_vp),
                ("grad", c_vp), ("grad_dtype", c_int), ("ld_grad", c_i64),
                ("n_counted", c_vp), ("n_nonfinite", c_vp)]


class CePartial(ctypes.Structure):
    _fields_ = [("max", c_dbl), ("sum", c_dbl), ("sumx", c_dbl),
                ("zsum", c_dbl), ("target", c_dbl), ("flags", c_i64)]


class CeOutputF64(ctypes.Structure):
    """xent_ce_output_f64: the outputs of xent_ce_f64 (float64 logits)."""
    _fields_ = [("loss", c_vp), ("nll", c_vp), ("logprob", c_vp),
                ("lse", c_vp), ("entropy", c_vp), ("stats", c_vp),
                ("grad", c_vp), ("ld_grad", c_i64),
                ("n_counted", c_vp), ("n_nonfinite", c_vp)]


STRUCTS = {"xent_ce_opts": CeOpts, "xent_ce_input": CeInput,
           "xent_ce_stats": CeStats, "xent_ce_output": CeOutput,
           "xent_ce_partial": CePartial,
           "xent_ce_output_f64": CeOutputF64}


# RL structs (include/xent/rl.h); enums are C ints.


class RlAdvOpts(ctypes.Structure):
    _fields_ = [("std", c_int), ("eps", c_dbl), ("subtract_mean", c_int)]


class RlGroups(ctypes.Structure):
    _fields_ = [("n", c_i64), ("ngroups", c_i64), ("offsets", c_vp),
                ("ids", c_vp)]


class RlAdvStats(ctypes.Structure):
    _fields_ = [("n_groups", c_i64), ("n_zero_var", c_i64),
                ("n_singleton", c_i64), ("n_empty", c_i64)]


class RlBatchOpts(ctypes.Structure):
    _fields_ = [("kind", c_int), ("std", c_int), ("subtract_mean", c_int),
                ("eps", c_dbl)]


class RlBatchStats(ctypes.Structure):
    _fields_ = [("n_counted", c_i64), ("mean", c_dbl), ("scale", c_dbl),
                ("degenerate", c_int)]


class RlLossOpts(ctypes.Structure):
    _fields_ = [("loss", c_int), ("eps_low", c_dbl), ("eps_high", c_dbl),
                ("dual_clip", c_dbl), ("log_ratio_clamp", c_dbl),
                ("agg", c_int), ("token_norm", c_dbl), ("seq_norm", c_dbl),
                ("tis", c_int), ("tis_mode", c_int), ("tis_cap", c_dbl),
                ("kl", c_int), ("kl_coef", c_dbl),
                ("zero_run_limit", c_i64)]


class RlInput(ctypes.Structure):
    _fields_ = [("T", c_i64), ("nseq", c_i64), ("offsets", c_vp),
                ("lp_new", c_vp), ("lp_old", c_vp), ("lp_sampler", c_vp),
                ("lp_ref", c_vp), ("advantages", c_vp),
                ("adv_layout", c_int), ("mask", c_vp)]


class RlLossStats(ctypes.Structure):
    _fields_ = [("loss", c_dbl), ("n_tokens", c_i64), ("n_seqs", c_i64),
                ("n_clamped", c_i64), ("n_clip_low", c_i64),
                ("n_clip_high", c_i64), ("n_dual_clip", c_i64),
                ("n_tis_clamped", c_i64), ("n_tis_truncated", c_i64),
                ("n_tis_masked", c_i64), ("n_kl_clamped", c_i64),
                ("kl_mean", c_dbl)]


class RlDiag(ctypes.Structure):
    _fields_ = [("n_tokens", c_i64), ("clip_frac_low", c_dbl),
                ("clip_frac_high", c_dbl), ("ratio_min", c_dbl),
                ("ratio_mean", c_dbl), ("ratio_max", c_dbl),
                ("ratio_frac_out", c_dbl), ("n_ratio_clamped", c_i64),
                ("has_weights", c_int), ("ess_frac", c_dbl),
                ("chi2", c_dbl), ("mismatch_kl_k1", c_dbl),
                ("mismatch_kl_k3", c_dbl), ("weight_max", c_dbl),
                ("n_weight_clamped", c_i64)]


class RlLpReport(ctypes.Structure):
    _fields_ = [("n_checked", c_i64), ("n_nan", c_i64), ("first_nan", c_i64),
                ("n_positive", c_i64), ("first_positive", c_i64),
                ("n_neg_inf", c_i64), ("first_neg_inf", c_i64),
                ("n_zero_runs", c_i64), ("first_zero_run", c_i64),
                ("longest_zero_run", c_i64)]


STRUCTS.update({"xent_rl_adv_opts": RlAdvOpts, "xent_rl_groups": RlGroups,
                "xent_rl_adv_stats": RlAdvStats,
                "xent_rl_batch_opts": RlBatchOpts,
                "xent_rl_batch_stats": RlBatchStats,
                "xent_rl_loss_opts": RlLossOpts, "xent_rl_input": RlInput,
                "xent_rl_loss_stats": RlLossStats, "xent_rl_diag": RlDiag,
                "xent_rl_lp_report": RlLpReport})

# The fused LM head (include/xent/cuda.h).


class LinearInput(ctypes.Structure):
    _fields_ = [("hidden", c_vp), ("weight", c_vp), ("bias", c_vp),
                ("dtype", c_int), ("T", c_i64), ("H", c_i64), ("V", c_i64),
                ("labels", c_vp), ("label_dtype", c_int),
                ("grad_rows", c_vp)]


class LinearGrads(ctypes.Structure):
    _fields_ = [("hidden", c_vp), ("hidden_dtype", c_int),
                ("weight", c_vp), ("weight_dtype", c_int),
                ("bias", c_vp), ("bias_dtype", c_int),
                ("accumulate", c_int)]


STRUCTS.update({"xent_linear_input": LinearInput,
                "xent_linear_grads": LinearGrads})

STATS_DOUBLES = ctypes.sizeof(CeStats) // 8      # 2 doubles per row
PARTIAL_WORDS = ctypes.sizeof(CePartial) // 8    # 6 8-byte words per row

_P = ctypes.POINTER
# name: (restype, argtypes); every xent_status function returns c_int.
_SIGNATURES = {
    "xent_strerror": (ctypes.c_char_p, [c_int]),
    "xent_last_error": (ctypes.c_char_p, []),
    "xent_version": (ctypes.c_char_p, []),
    "xent_abi_sizeof": (ctypes.c_size_t, [ctypes.c_char_p]),
    "xent_set_num_threads": (c_int, [c_int]),
    "xent_num_threads": (c_int, [c_int]),
    "xent_ce_opts_init": (None, [_P(CeOpts)]),
    "xent_ce": (c_int, [_P(CeInput), _P(CeOpts), _P(CeOutput)]),
    "xent_logprobs": (c_int, [_P(CeInput), _P(CeOpts), c_vp, c_vp]),
    "xent_ce_backward": (c_int, [_P(CeInput), _P(CeOpts), c_vp, c_vp,
                                 c_int, c_i64]),
    "xent_ce_shard_stats": (c_int, [_P(CeInput), _P(CeOpts), c_vp]),
    "xent_ce_combine": (c_int, [c_vp, c_int, _P(CeInput), _P(CeOpts),
                                _P(CeOutput)]),
    "xent_ce_f64": (c_int, [_P(CeInput), _P(CeOpts), c_vp,
                            _P(CeOutputF64)]),
    "xent_cuda_linear_workspace": (ctypes.c_size_t, [_P(LinearInput),
                                                     _P(LinearGrads), c_i64]),
    "xent_cuda_linear_ce": (c_int, [_P(LinearInput), _P(CeOpts),
                                    _P(CeOutput), _P(LinearGrads), c_vp,
                                    ctypes.c_size_t, c_vp]),
    "xent_cuda_linear_logprobs": (c_int, [_P(LinearInput), _P(CeOpts), c_vp,
                                          c_vp, c_vp, ctypes.c_size_t,
                                          c_vp]),
    "xent_cuda_linear_shard_stats": (c_int, [_P(LinearInput), _P(CeOpts),
                                             c_vp, c_vp, ctypes.c_size_t,
                                             c_vp]),
    "xent_cuda_linear_backward": (c_int, [_P(LinearInput), _P(CeOpts), c_vp,
                                          _P(LinearGrads), c_vp,
                                          ctypes.c_size_t, c_vp]),
    # the CUDA twins of the shard calls (stream last), for the chunked
    # fused head on CUDA (xent/_linear_cpu.py)
    "xent_cuda_set_label_check": (c_int, [c_int]),
    "xent_cuda_ce_backward": (c_int, [_P(CeInput), _P(CeOpts), c_vp, c_vp,
                                      c_int, c_i64, c_vp]),
    "xent_cuda_ce_shard_stats": (c_int, [_P(CeInput), _P(CeOpts), c_vp,
                                         c_vp]),
    "xent_cuda_ce_combine": (c_int, [c_vp, c_int, _P(CeInput), _P(CeOpts),
                                     _P(CeOutput), c_vp]),
    "xent_rl_adv_opts_init": (None, [_P(RlAdvOpts)]),
    "xent_rl_batch_opts_init": (None, [_P(RlBatchOpts)]),
    "xent_rl_loss_opts_init": (None, [_P(RlLossOpts)]),
    # processed log-probs (include/xent/sampler.h; structs in _sampler.py)
    "xent_sampler_opts_init": (None, [c_vp]),
    "xent_sampler_logprobs": (c_int, [_P(CeInput), c_vp, c_vp]),
    "xent_cuda_sampler_logprobs": (c_int, [_P(CeInput), c_vp, c_vp, c_vp]),
}
# The RL calls: CPU argtypes; the CUDA twin (xent_cuda_rl_*) adds a stream.
_RL_ARGS = {
    "group_advantages": [c_vp, _P(RlGroups), _P(RlAdvOpts), c_vp, c_vp, c_vp,
                         _P(RlAdvStats)],
    "batch_normalize": [c_vp, c_i64, c_vp, _P(RlBatchOpts), c_vp,
                        _P(RlBatchStats)],
    "policy_loss": [_P(RlInput), _P(RlLossOpts), c_vp, c_vp,
                    _P(RlLossStats)],
    "kl_estimate": [c_int, c_vp, c_vp, c_i64, c_vp, c_dbl, c_vp, c_vp,
                    _P(c_i64)],
    "diagnostics": [_P(RlInput), _P(RlLossOpts), _P(RlDiag)],
    "check_logprobs": [ctypes.c_char_p, c_vp, c_i64, c_vp, c_i64, c_vp, c_int,
                       c_i64, _P(RlLpReport)],
}
for _k, _a in _RL_ARGS.items():
    _SIGNATURES["xent_rl_" + _k] = (c_int, _a)
    _SIGNATURES["xent_cuda_rl_" + _k] = (c_int, _a + [c_vp])


def _candidates():
    env = os.environ.get("XENT_LIBRARY")
    if env:
        return [pathlib.Path(env)]
    here = pathlib.Path(__file__).resolve().parent
    return [here / "_lib" / "libxent.so",                 # installed wheel
            here.parent.parent / "build" / "libxent.so"]  # source checkout


class _Lib:
    """Loads libxent.so on first use and binds functions by name."""

    def __init__(self):
        self._dll = None
        self.path = None
        self._fns = {}

    def dll(self):
        if self._dll is None:
            tried = []
            for p in _candidates():
                if p.is_file():
                    try:
                        self._dll = ctypes.CDLL(str(p))
                    except OSError as e:
                        raise XentError("cannot load %s: %s" % (p, e)) from e
                    self.path = str(p)
                    break
                tried.append(str(p))
            if self._dll is None:
                raise XentError("libxent.so not found (looked in: %s); "
                                "install with `pip install ./python` or "
                                "set XENT_LIBRARY" % ", ".join(tried))
            _apply_thread_env(self._dll)
        return self._dll

    def has(self, name):
        return hasattr(self.dll(), name)

    def fn(self, name):
        f = self._fns.get(name)
        if f is None:
            dll = self.dll()
            if not hasattr(dll, name):
                raise XentError("%s: not in this build of libxent (%s)"
                                % (name, self.path), ERR_UNSUPPORTED)
            f = getattr(dll, name)
            sig = _SIGNATURES.get(name)
            if sig is not None:
                f.restype, f.argtypes = sig
            else:
                f.restype = c_int
            self._fns[name] = f
        return f

    def call(self, name, *args):
        """Calls an xent_status function; raises XentError on failure."""
        st = self.fn(name)(*args)
        if st != OK:
            raise error_from_status(st, name)


def _apply_thread_env(dll):
    """The library reads no environment variable; the package honours
    XENT_NUM_THREADS (a positive integer: the default thread count of calls
    whose `threads` is 0) by passing it to xent_set_num_threads once, when
    the library is loaded."""
    v = os.environ.get("XENT_NUM_THREADS", "").strip()
    if not v or not hasattr(dll, "xent_set_num_threads"):
        return
    try:
        n = int(v)
    except ValueError:
        raise XentError("XENT_NUM_THREADS = %r is not an integer" % v,
                        ERR_VALUE) from None
    f = dll.xent_set_num_threads
    f.restype, f.argtypes = c_int, [c_int]
    f(max(0, min(n, 256)))


def set_num_threads(n):
    """Sets the process default thread count (n <= 0: all cores); returns
    the previous setting (0 for all cores)."""
    return LIB.fn("xent_set_num_threads")(_int("n", n, 31))


def num_threads(requested=0):
    """Threads a call with `threads=requested` gets (0: the default)."""
    return LIB.fn("xent_num_threads")(_int("requested", requested, 31))


LIB = _Lib()


def error_from_status(st, where):
    msg = LIB.fn("xent_last_error")().decode("utf-8", "replace")
    if not msg:
        msg = LIB.fn("xent_strerror")(st).decode("utf-8", "replace")
    cls = XentTypeError if st == ERR_DTYPE else XentError
    return cls("%s: %s" % (where, msg), st)


def version():
    return LIB.fn("xent_version")().decode()


def abi_mismatches():
    """Lists every struct size / field offset that differs from the C side
    (empty when the mirrors are right)."""
    sizeof = LIB.fn("xent_abi_sizeof")
    bad = []
    for cname, cls in STRUCTS.items():
        want = sizeof(cname.encode())
        if want != ctypes.sizeof(cls):
            bad.append("sizeof(%s): C %d, Python %d"
                       % (cname, want, ctypes.sizeof(cls)))
        for field, _ in cls._fields_:
            key = "%s.%s" % (cname, field)
            want = sizeof(key.encode())
            got = getattr(cls, field).offset
            if want != got:
                bad.append("offsetof(%s): C %d, Python %d" % (key, want, got))
    return bad


def make_opts(*, ignore_index=-100, reduction="mean", normalizer=None,
              temperature=1.0, softcap=None, z_loss=0.0, label_smoothing=0.0,
              grad_scale=1.0, vocab_start=0, vocab_total=0, threads=0):
    """An xent_ce_opts from the Python keyword arguments (checked by C)."""
    if reduction not in REDUCTIONS:
        raise XentError("reduction = %r: must be one of 'none', 'sum', "
                        "'mean'" % (reduction,), ERR_VALUE)
    o = CeOpts()
    LIB.fn("xent_ce_opts_init")(ctypes.byref(o))
    o.ignore_index = _int("ignore_index", ignore_index, 63)
    o.reduction = REDUCTIONS[reduction]
    o.normalizer = 0.0 if normalizer is None else _float("normalizer",
                                                         normalizer)
    o.temperature = _float("temperature", temperature)
    o.softcap = 0.0 if softcap is None else _float("softcap", softcap)
    o.z_loss = _float("z_loss", z_loss)
    o.label_smoothing = _float("label_smoothing", label_smoothing)
    o.grad_scale = _float("grad_scale", grad_scale)
    o.vocab_start = _int("vocab_start", vocab_start, 63)
    o.vocab_total = _int("vocab_total", vocab_total, 63)
    o.threads = _int("threads", threads, 31)
    return o


def _float(name, v):
    try:
        return float(v)
    except (TypeError, ValueError):
        raise XentError("%s = %r is not a number" % (name, v),
                        ERR_VALUE) from None


def _int(name, v, bits):
    """v as an int that fits a signed (bits+1)-bit C field (ctypes would
    silently wrap it)."""
    try:
        i = int(v)
    except (TypeError, ValueError):
        raise XentError("%s = %r is not an integer" % (name, v),
                        ERR_VALUE) from None
    if i != v or not -(1 << bits) <= i < (1 << bits):
        raise XentError("%s = %r is not an integer in [-2^%d, 2^%d)"
                        % (name, v, bits, bits), ERR_VALUE)
    return i
