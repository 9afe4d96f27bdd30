"""Robust linear regression toward a prior (pure numpy, no I/O).

:func:`robust_fit` minimises, over coefficients ``b``::

    sum_i huber(r_i / s) * s**2  +  prior_weight * sum_j (f_j * (b_j - p_j))**2

with relative residuals ``r_i = (y_i - x_i . b) / y_i`` (timings are heteroscedastic: a
10 ms error matters on a 50 ms prefill, not on a 5 s one), ``s`` the residuals' scale
(1.4826 * MAD, re-estimated every iteration) and ``f_j`` the RMS of feature ``j`` divided
by the mean target, so the prior counts as ``prior_weight`` pseudo-observations of the
same size as the data. It is iteratively reweighted least squares (IRLS): an outlier's
weight falls as ``delta * s / |r|`` beyond ``delta * s`` (Huber, ``delta = 1.345``, 95%
efficient on Gaussian noise), so a few wildly slow requests (a preempted sequence, a GC
pause) move the fit by a bounded amount. The prior term is a ridge toward the profile's
coefficients: with few samples the fit stays near the prior, with many the data dominate;
it also keeps collinear features (batch size and total context grow together) solvable.

Every coefficient is at least 0 (each is a time per unit of something, or a fixed cost):
each least-squares step is solved under that bound. Unbounded, a fit on data that barely
vary a feature (short, mostly cached prompts: the n^2 column is nearly constant) can take
a negative quadratic term that prices long prompts at or below 0 ms.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["lstsq_nonneg", "median_rel_error", "robust_fit"]

Array = npt.NDArray[np.float64]

HUBER_DELTA = 1.345
_MAD_TO_SIGMA = 1.4826


def robust_fit(
    x: Array,
    y: Array,
    prior: Array,
    *,
    prior_weight: float,
    iterations: int = 20,
    floor: float = 1e-3,
) -> Array:
    """Coefficients for ``y ~ x @ b`` (``x`` is n x k, ``y`` has n entries > 0), pulled
    toward ``prior`` (k entries) with ``prior_weight`` pseudo-observations. With n == 0
    returns ``prior``."""
    n = x.shape[0]
    if n == 0:
        return prior.astype(np.float64)
    yy = np.maximum(y, floor)
    # relative residuals: divide each row by its target
    xs = x / yy[:, None]
    ys = np.ones(n)
    scale_f = np.sqrt(np.mean(xs * xs, axis=0))  # per-feature RMS, relative units
    scale_f[scale_f == 0] = 1.0
    pen = np.sqrt(prior_weight) * scale_f
    a_prior = np.diag(pen)
    b_prior = pen * prior
    w = np.ones(n)
    coef = prior.astype(np.float64)
    for _ in range(iterations):
        sw = np.sqrt(w)
        a = np.vstack([xs * sw[:, None], a_prior])
        b = np.concatenate([ys * sw, b_prior])
        new = lstsq_nonneg(a, b)
        r = ys - xs @ new
        s = _MAD_TO_SIGMA * float(np.median(np.abs(r - np.median(r))))
        s = max(s, 1e-6)
        t = np.abs(r) / (HUBER_DELTA * s)
        w = np.where(t <= 1.0, 1.0, 1.0 / np.maximum(t, 1e-12))
        done = bool(np.allclose(new, coef, rtol=1e-6, atol=1e-9))
        coef = new
        if done:
            break
    return np.asarray(coef, dtype=np.float64)


def median_rel_error(x: Array, y: Array, coef: Array, floor: float = 1e-3) -> float:
    """Median of ``|x @ coef - y| / y`` (0.0 for no rows)."""
    if x.shape[0] == 0:
        return 0.0
    pred = x @ coef
    return float(np.median(np.abs(pred - y) / np.maximum(y, floor)))


def lstsq_nonneg(a: Array, b: Array) -> Array:
    """``argmin |a @ x - b|`` subject to ``x >= 0``, exactly, for the few columns the models
    have: the unbounded solution when it is feasible; else, as the bounded optimum is the
    unbounded solution on its non-zero columns, the best feasible one over the column
    subsets (at most 2^k - 2 small solves; k <= 3 here)."""
    x, *_ = np.linalg.lstsq(a, b, rcond=None)
    if bool((x >= 0.0).all()):
        return np.asarray(x, dtype=np.float64)
    k = a.shape[1]
    best, best_r = np.zeros(k), float(b @ b)
    for mask in range(1, (1 << k) - 1):
        cols = [j for j in range(k) if mask >> j & 1]
        sub, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if bool((sub < 0.0).any()):
            continue
        full = np.zeros(k)
        full[cols] = sub
        r = a @ full - b
        if float(r @ r) < best_r:
            best, best_r = full, float(r @ r)
    return best
