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


STRUCTS = {"xent_ce_opts": CeOpts, "xent_ce_input": CeInput,
           "xent_ce_stats": CeStats, "xent_ce_output": CeOutput,
           "xent_ce_partial": CePartial}
STATS_DOUBLES = ctypes.sizeof(CeStats) // 8      # 2 doubles per row
PARTIAL_WORDS = ctypes.sizeof(CePartial) // 8    # 6 8-byte words per row

_P = ctypes.POINTER
# name: (restype, argtypes); every xent_status function returns c_int.
_SIGNATURES = {
    "xent_strerror": (ctypes.c_char_p, [c_int]),
    "xent_last_error": (ctypes.c_char_p, []),
    "xent_version": (ctypes.c_char_p, []),
    "xent_abi_sizeof": (ctypes.c_size_t, [ctypes.c_char_p]),
    "xent_ce_opts_init": (None, [_P(CeOpts)]),
    "xent_ce": (c_int, [_P(CeInput), _P(CeOpts), _P(CeOutput)]),
    "xent_logprobs": (c_int, [_P(CeInput), _P(CeOpts), c_vp, c_vp]),
    "xent_ce_backward": (c_int, [_P(CeInput), _P(CeOpts), c_vp, c_vp,
                                 c_int, c_i64]),
    "xent_ce_shard_stats": (c_int, [_P(CeInput), _P(CeOpts), c_vp]),
    "xent_ce_combine": (c_int, [c_vp, c_int, _P(CeInput), _P(CeOpts),
                                _P(CeOutput)]),
}


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
