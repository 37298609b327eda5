"""Float64 reference of the cross-entropy contract in include/xent.h.

Its own error is far below the float32 ulp the kernels are held to: every
quantity is formed from the exactly converted logits with O(V) float64
operations whose terms have one sign (sums of exponentials, softplus of a
log-sum), so the relative error is at most ~V * 2^-53 < 2^-36 for the V used
in the tests, against the 2^-24 of one float32 ulp. The target's gradient is
formed as -(sum of the non-target probabilities), never p_t - 1."""
import numpy as np


def transform(z, temperature=1.0, softcap=None):
    z = np.asarray(z, dtype=np.float64)
    if softcap:
        z = softcap * np.tanh(z / softcap)
    return z / temperature


def _lse(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    s = np.sum(np.exp(x - m), axis=axis, keepdims=True)
    return (m + np.log(s))[..., 0]


def _softplus(d):
    return np.where(d > 0, d + np.log1p(np.exp(-np.abs(d))),
                    np.log1p(np.exp(np.minimum(d, 0))))


def rows(z, labels, *, ignore_index=-100, temperature=1.0, softcap=None,
         z_loss=0.0, label_smoothing=0.0):
    """Per-row loss, nll, lse, entropy ([T]) and gradient of the loss [T, V]
    in float64, with the magnitudes (sums of |terms|) behind each."""
    zp = transform(z, temperature, softcap)                  # [T, V]
    T, V = zp.shape
    lab = np.asarray(labels).reshape(-1)
    counted = lab != ignore_index
    t = np.where(counted, lab, 0)
    lse = _lse(zp)                                           # [T]
    zt = zp[np.arange(T), t]
    others = zp.copy()
    others[np.arange(T), t] = -np.inf
    d = _lse(others) - zt            # log sum_{j!=t} exp(z'_j - z'_t)
    nll = np.where(counted, _softplus(d), 0.0)
    p = np.exp(zp - lse[:, None])                            # [T, V]
    ent = lse - np.sum(p * zp, axis=1)
    eps = label_smoothing
    smooth = lse - zp.mean(axis=1)
    loss = np.where(counted, (1 - eps) * nll + eps * smooth
                    + z_loss * lse ** 2, 0.0)
    onehot_gap = p.copy()                                    # p - onehot(t)
    p_nt = np.exp(_lse(others) - lse)                        # sum_{j!=t} p_j
    onehot_gap[np.arange(T), t] = -p_nt
    g = (1 - eps) * onehot_gap + eps * (p - 1.0 / V) \
        + 2 * z_loss * lse[:, None] * p
    gmag = (1 - eps) * np.abs(onehot_gap) + eps * (p + 1.0 / V) \
        + 2 * z_loss * np.abs(lse[:, None]) * p
    slope = 1.0 / temperature
    if softcap:
        slope = slope * (1 - np.tanh(np.asarray(z, np.float64) / softcap) ** 2)
    g, gmag = g * slope, gmag * slope
    g[~counted] = 0.0
    gmag[~counted] = 0.0
    lmag = np.where(counted, (1 - eps) * nll + eps * (np.abs(lse) + np.abs(
        zp).mean(axis=1)) + z_loss * lse ** 2, 0.0)
    emag = np.abs(lse) + np.sum(p * np.abs(zp), axis=1)
    return dict(loss=loss, nll=nll, lse=lse, ent=ent, grad=g, counted=counted,
                gmag=gmag, lmag=lmag, emag=emag)


def reduce(loss, g, counted, reduction, normalizer=None, grad_output=1.0):
    """Reduced loss and the matching gradient."""
    g = g * np.reshape(grad_output, (-1, 1)) if reduction == "none" \
        else g * grad_output
    if reduction == "none":
        return loss, g
    if reduction == "sum":
        return loss.sum(), g
    n = normalizer if normalizer else counted.sum()
    return (loss.sum() / n if n else 0.0), (g / n if n else g * 0)
