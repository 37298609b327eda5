"""Helpers shared by the tests: bf16 bits, and the faithful-rounding check.

Tolerance (derived, not tuned): the CPU kernel promises that every output is
faithfully rounded (src/cpu/ce.c, docs/numerics.md): the stored value is one
of the two representable numbers around the exact result, so
|out - exact| < ulp(exact) in the output format. The float64 reference
(reference.py) is within ~2^-36 relative of the exact result, which we allow
on top as 2^-34 * mag, where mag is the sum of the magnitudes of the terms
the reference added (|ref| when there is no cancellation)."""
import numpy as np

MANT = {"f32": 23, "bf16": 7, "f16": 10}
MIN_EXP = {"f32": -126, "bf16": -126, "f16": -14}


def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bf16 bit patterns (uint16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = u.astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(h):
    return (np.asarray(h, dtype=np.uint32) << 16).view(np.float32)


def ulp(x, fmt="f32"):
    """Spacing of the output format at |x| (the larger one at a binade
    edge), subnormal spacing near 0."""
    ax = np.abs(np.asarray(x, dtype=np.float64))
    e = np.floor(np.log2(np.where(ax > 0, ax, 1.0)))
    e = np.maximum(e, MIN_EXP[fmt])
    return np.exp2(e - MANT[fmt])


def check_faithful(out, ref, fmt="f32", mag=None, what="value"):
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, (what, out.shape, ref.shape)
    assert np.all(np.isfinite(out)), "%s: non-finite output" % what
    mag = np.abs(ref) if mag is None else np.asarray(mag, dtype=np.float64)
    tol = ulp(ref, fmt) + 2.0 ** -34 * mag
    err = np.abs(out - ref)
    bad = np.argwhere(err > tol)
    assert bad.size == 0, "%s: %d elements off, first at %s: got %r, want " \
        "%r (tol %r)" % (what, len(bad), tuple(bad[0]), out[tuple(bad[0])],
                         ref[tuple(bad[0])], tol[tuple(bad[0])])
