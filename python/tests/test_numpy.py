"""NumPy front end against the float64 reference (runs in CI)."""
import numpy as np
import pytest

import xent
from reference import reduce, rows
from util import (bf16_bits_to_f32, check_faithful, f32_to_bf16_bits)

IGN = -100


def make(rng, T=37, V=1000, scale=3.0, ignore_frac=0.2, dtype=np.float32):
    """Random logits [T, V] and labels [T] with some rows ignored."""
    z = (rng.standard_normal((T, V)) * scale).astype(dtype)
    y = rng.integers(0, V, size=T).astype(np.int64)
    y[rng.random(T) < ignore_frac] = IGN
    return z, y


OPTION_SETS = [
    {},
    {"temperature": 0.7},
    {"softcap": 4.0},
    {"z_loss": 1e-3},
    {"label_smoothing": 0.1},
    {"temperature": 1.3, "softcap": 6.0, "z_loss": 2e-4,
     "label_smoothing": 0.05},
]


def test_abi_matches_c():
    assert xent.abi_mismatches() == []


def test_version():
    assert xent.version().startswith(xent.__version__)


@pytest.mark.parametrize("opts", OPTION_SETS)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_forward_matches_reference(rng, opts, reduction):
    z, y = make(rng)
    ref = rows(z, y, **opts)
    got = xent.cross_entropy(z, y, reduction=reduction, **opts)
    want, _ = reduce(ref["loss"], ref["grad"], ref["counted"], reduction)
    if reduction == "none":
        assert got.dtype == np.float32 and got.shape == y.shape
        check_faithful(got, want, mag=ref["lmag"], what="loss")
    else:
        n = ref["counted"].sum() if reduction == "mean" else 1
        check_faithful(got, want, mag=ref["lmag"].sum() / n, what="loss")


@pytest.mark.parametrize("opts", OPTION_SETS)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_grad_matches_reference(rng, opts, reduction):
    z, y = make(rng, T=23, V=517)
    # grad_rows are float32 in the C API: draw them as float32
    go = rng.standard_normal(y.shape).astype(np.float32) \
        if reduction == "none" else 0.75
    ref = rows(z, y, **opts)
    want_l, want_g = reduce(ref["loss"], ref["grad"], ref["counted"],
                            reduction, grad_output=go)
    _, gmag = reduce(ref["loss"], ref["gmag"], ref["counted"], reduction,
                     grad_output=np.abs(go))
    z0 = z.copy()
    loss, g = xent.cross_entropy_grad(z, y, reduction=reduction,
                                      grad_output=go, **opts)
    assert g.dtype == np.float32 and g.shape == z.shape
    check_faithful(g, want_g, mag=gmag, what="grad")
    assert np.array_equal(z, z0), "logits changed without inplace"
    n = ref["counted"].sum() if reduction == "mean" else 1
    check_faithful(loss, want_l, mag=np.sum(ref["lmag"]) / n, what="loss")


def test_grad_normalizer(rng):
    z, y = make(rng, T=16, V=300)
    ref = rows(z, y)
    loss, g = xent.cross_entropy_grad(z, y, normalizer=1000.0)
    wl, wg = reduce(ref["loss"], ref["grad"], ref["counted"], "mean", 1000.0)
    check_faithful(loss, wl, mag=ref["lmag"].sum() / 1000, what="loss")
    check_faithful(g, wg, mag=ref["gmag"] / 1000, what="grad")


def test_inplace_grad_overwrites_logits(rng):
    z, y = make(rng, T=9, V=333)
    loss_a, g_a = xent.cross_entropy_grad(z.copy(), y)
    loss_b, g_b = xent.cross_entropy_grad(z, y, inplace=True)
    assert g_b is z
    assert np.array_equal(g_a, z) and loss_a == loss_b


def test_all_rows_ignored_mean_is_zero(rng):
    z, _ = make(rng, T=5, V=50)
    y = np.full(5, IGN)
    loss, g = xent.cross_entropy_grad(z, y)
    assert loss == 0 and not np.any(g)


def test_empty_batch():
    z = np.zeros((0, 10), np.float32)
    y = np.zeros(0, np.int64)
    assert xent.cross_entropy(z, y) == 0
    assert xent.cross_entropy(z, y, reduction="none").shape == (0,)


def test_logprobs_and_entropy(rng):
    z, y = make(rng, T=31, V=777)
    ref = rows(z, y, temperature=0.9)
    lp, ent = xent.logprobs(z, y, temperature=0.9, entropy=True)
    check_faithful(lp, -ref["nll"], what="logprob")
    check_faithful(ent, ref["ent"], mag=ref["emag"], what="entropy")
    lp_only = xent.logprobs(z, y, temperature=0.9)
    assert np.array_equal(lp_only, lp)


def test_batch_shape_kept(rng):
    z, y = make(rng, T=24, V=64)
    z3, y3 = z.reshape(4, 6, 64), y.reshape(4, 6)
    none = xent.cross_entropy(z3, y3, reduction="none")
    assert none.shape == (4, 6)
    assert np.array_equal(none.reshape(-1),
                          xent.cross_entropy(z, y, reduction="none"))
    _, g3 = xent.cross_entropy_grad(z3, y3)
    _, g = xent.cross_entropy_grad(z, y)
    assert np.array_equal(g3.reshape(24, 64), g)
    assert xent.logprobs(z3, y3).shape == (4, 6)


def test_strided_rows_are_read_in_place(rng):
    """A column slice has row stride ld > V: read through ld, no copy."""
    big, y = make(rng, T=12, V=200)
    z = big[:, 10:150]
    y = np.where(y == IGN, IGN, y % 140)
    assert not z.flags.c_contiguous
    a = xent.cross_entropy(z, y, reduction="none")
    b = xent.cross_entropy(np.ascontiguousarray(z), y, reduction="none")
    assert np.array_equal(a, b)
    la, ga = xent.cross_entropy_grad(z, y)
    lb, gb = xent.cross_entropy_grad(np.ascontiguousarray(z), y)
    assert np.array_equal(ga, gb) and la == lb
    # every other row: row stride 2 * 200 elements
    zz = big[::2, :]
    yy = np.where(y[::2] == IGN, IGN, y[::2])
    assert np.array_equal(xent.cross_entropy(zz, yy, reduction="none"),
                          xent.cross_entropy(zz.copy(), yy, reduction="none"))


def test_strided_inplace_keeps_the_other_columns(rng):
    big, y = make(rng, T=6, V=100)
    y = np.where(y == IGN, IGN, y % 60)
    keep = big[:, 60:].copy()
    _, want = xent.cross_entropy_grad(big[:, :60].copy(), y)
    _, g = xent.cross_entropy_grad(big[:, :60], y, inplace=True)
    assert np.array_equal(big[:, :60], want)
    assert np.array_equal(big[:, 60:], keep)


def test_threads_do_not_change_bits(rng):
    z, y = make(rng, T=50, V=300)
    a = xent.cross_entropy_grad(z, y, reduction="none", threads=1)
    b = xent.cross_entropy_grad(z, y, reduction="none", threads=4)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_dead_zone_row_is_exact():
    """A confident row (margin 20): fp32 `lse - z_t` gives exactly 0, xent
    gives exp(-20) to within one float32 ulp."""
    V = 4096
    z = np.zeros((1, V), np.float32)
    z[0, 7] = 20.0 + np.log(V - 1)    # margin z_t - lse_{j!=t} = 20 (fp32)
    y = np.array([7])
    m = np.float64(z[0, 7]) - np.log(V - 1)
    want = np.log1p(np.exp(-m))
    zz = z.astype(np.float32)
    naive = (np.log(np.exp(zz - zz.max()).sum(dtype=np.float32)) + zz.max()
             - zz[0, 7]).astype(np.float32)
    assert naive == 0.0
    got = xent.cross_entropy(z, y)
    check_faithful(got, want, what="dead-zone nll")
    _, g = xent.cross_entropy_grad(z, y)
    check_faithful(g[0, 7], -(-np.expm1(-want)), what="target grad")
    assert g[0, 7] < 0 and g[0].sum(dtype=np.float64) == pytest.approx(
        0, abs=2 * V * 2.0 ** -24 * float(np.max(np.abs(g))))


# --- bf16 / f16 ----------------------------------------------------------


def test_bf16_bits_with_dtype_keyword(rng):
    z32, y = make(rng, T=20, V=400)
    bits = f32_to_bf16_bits(z32)
    exact = bf16_bits_to_f32(bits)
    ref = rows(exact, y)
    got = xent.cross_entropy(bits, y, dtype="bf16", reduction="none")
    check_faithful(got, ref["loss"], what="bf16 loss")
    loss, g = xent.cross_entropy_grad(bits, y, dtype="bf16")
    assert g.dtype == np.uint16
    n = ref["counted"].sum()
    check_faithful(bf16_bits_to_f32(g), ref["grad"] / n, fmt="bf16",
                   mag=ref["gmag"] / n, what="bf16 grad")
    _, g32 = xent.cross_entropy_grad(bits, y, dtype="bf16", grad_dtype="f32")
    assert g32.dtype == np.float32
    check_faithful(g32, ref["grad"] / n, mag=ref["gmag"] / n, what="grad f32")


def test_ml_dtypes_bfloat16(rng):
    ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes not installed")
    z32, y = make(rng, T=8, V=100)
    zb = z32.astype(ml.bfloat16)
    bits = zb.view(np.uint16)
    a = xent.cross_entropy(zb, y, reduction="none")
    b = xent.cross_entropy(bits, y, dtype="bf16", reduction="none")
    assert np.array_equal(a, b)
    _, g = xent.cross_entropy_grad(zb, y)
    assert g.dtype == zb.dtype


def test_float16(rng):
    z32, y = make(rng, T=20, V=400)
    z16 = z32.astype(np.float16)
    ref = rows(z16.astype(np.float32), y)
    check_faithful(xent.cross_entropy(z16, y, reduction="none"), ref["loss"],
                   what="f16 loss")
    _, g = xent.cross_entropy_grad(z16, y, reduction="sum")
    assert g.dtype == np.float16
    check_faithful(g, ref["grad"], fmt="f16", mag=ref["gmag"], what="f16 grad")


# --- bad input: clear exceptions, nothing modified -----------------------


def test_float64_logits_rejected(rng):
    z, y = make(rng, T=3, V=10)
    with pytest.raises(xent.XentTypeError, match="float64.*astype"):
        xent.cross_entropy(z.astype(np.float64), y)
    with pytest.raises(TypeError):      # XentTypeError is a TypeError too
        xent.cross_entropy(z.astype(np.float64), y)


def test_uint16_needs_dtype(rng):
    with pytest.raises(xent.XentTypeError, match="dtype='bf16'"):
        xent.cross_entropy(np.zeros((2, 4), np.uint16), np.zeros(2, np.int64))
    with pytest.raises(xent.XentTypeError, match="cannot be read as bf16"):
        xent.cross_entropy(np.zeros((2, 4), np.float32),
                           np.zeros(2, np.int64), dtype="bf16")
    with pytest.raises(xent.XentTypeError, match="must be 'bf16'"):
        xent.cross_entropy(np.zeros((2, 4), np.uint16),
                           np.zeros(2, np.int64), dtype="int8")


def test_not_an_array():
    with pytest.raises(xent.XentTypeError, match="numpy.ndarray"):
        xent.cross_entropy([[1.0, 2.0]], np.zeros(1, np.int64))


def test_bad_labels(rng):
    z, y = make(rng, T=5, V=10, ignore_frac=0)
    with pytest.raises(xent.XentTypeError, match="labels dtype float32"):
        xent.cross_entropy(z, y.astype(np.float32))
    with pytest.raises(xent.XentError, match=r"labels shape \(4,\) does not "
                       r"match the logits' leading shape \(5,\)"):
        xent.cross_entropy(z, y[:4])
    with pytest.raises(xent.XentError, match="labels shape"):
        xent.cross_entropy(z, y.reshape(5, 1))
    with pytest.raises(xent.XentError, match="labels is None"):
        xent.cross_entropy(z, None)


def test_label_out_of_range_leaves_logits_untouched(rng):
    z, y = make(rng, T=5, V=10, ignore_frac=0)
    y[3] = 10
    z0 = z.copy()
    with pytest.raises(xent.XentError, match=r"labels\[3\] = 10 is outside "
                       r"\[0, 10\)") as ei:
        xent.cross_entropy_grad(z, y, inplace=True)
    assert ei.value.status == 3          # XENT_ERR_LABEL
    assert np.array_equal(z, z0)
    y[3] = -5
    with pytest.raises(xent.XentError, match=r"labels\[3\] = -5"):
        xent.logprobs(z, y)


def test_bad_options(rng):
    z, y = make(rng, T=4, V=10)
    with pytest.raises(xent.XentError, match="reduction"):
        xent.cross_entropy(z, y, reduction="avg")
    with pytest.raises(xent.XentError, match="temperature"):
        xent.cross_entropy(z, y, temperature=0.0)
    with pytest.raises(xent.XentError, match="label_smoothing"):
        xent.cross_entropy(z, y, label_smoothing=1.5)
    with pytest.raises(xent.XentError, match="softcap"):
        xent.cross_entropy(z, y, softcap=-1.0)
    with pytest.raises(xent.XentError, match="grad_output must be a scalar"):
        xent.cross_entropy_grad(z, y, grad_output=np.ones(4))
    with pytest.raises(xent.XentError, match="grad_output shape"):
        xent.cross_entropy_grad(z, y, reduction="none",
                                grad_output=np.ones(3))
    with pytest.raises(xent.XentError, match="inplace_backward"):
        xent.cross_entropy(z, y, inplace_backward=True)
    with pytest.raises(xent.XentError, match="ignore_index = 2361"):
        xent.cross_entropy(z, y, ignore_index=2 ** 71)   # would wrap to 0
    with pytest.raises(xent.XentError, match="ignore_index = 1.5"):
        xent.cross_entropy(z, y, ignore_index=1.5)
    with pytest.raises(xent.XentError, match="temperature = 'x' is not a"):
        xent.cross_entropy(z, y, temperature="x")


def test_layouts_that_need_a_copy_are_rejected(rng):
    z, y = make(rng, T=6, V=6, ignore_frac=0)
    with pytest.raises(xent.XentError, match="ascontiguousarray"):
        xent.cross_entropy(z.T, y)           # column stride != 1
    z3 = rng.standard_normal((4, 5, 8)).astype(np.float32)
    with pytest.raises(xent.XentError, match="contiguous"):
        xent.cross_entropy(z3.transpose(1, 0, 2), np.zeros((5, 4), np.int64))
    with pytest.raises(xent.XentError, match="at least 2 dimensions"):
        xent.cross_entropy(z[0], y[0])


def test_readonly_inplace_rejected(rng):
    z, y = make(rng, T=3, V=10, ignore_frac=0)
    z.setflags(write=False)
    with pytest.raises(xent.XentError, match="writeable"):
        xent.cross_entropy_grad(z, y, inplace=True)


def test_nonfinite_rows_are_nan(rng):
    z, y = make(rng, T=4, V=10, ignore_frac=0)
    z[2, 5] = np.nan
    loss = xent.cross_entropy(z, y, reduction="none")
    assert np.isnan(loss[2]) and np.all(np.isfinite(loss[[0, 1, 3]]))


def test_strided_labels_and_int32(rng):
    z, y = make(rng, T=10, V=50)
    y2 = np.stack([y, y], axis=1)                  # y2[:, 0] is strided
    a = xent.cross_entropy(z, y2[:, 0], reduction="none")
    b = xent.cross_entropy(z, y.astype(np.int32), reduction="none")
    assert np.array_equal(a, xent.cross_entropy(z, y, reduction="none"))
    assert np.array_equal(a, b)
