"""Online robust fit of one deployment x role's performance model (pure: no I/O, ``now``
injected).

:class:`RoleSamples` keeps a bounded recent sample of each kind (the newest
``max_samples``; older ones fall off, so the fit follows a fleet that changes):

* prefill: ``(n uncached tokens, q prefill tokens queued ahead, TTFT - queue ms)``;
* decode: ``(b batch, c total context tokens, inter-token ms)``; samples from records
  first — load snapshots and ``/metrics`` scrapes go to a separate fallback sample that is
  used only while the records' one has fewer than ``min_samples``;
* transfer: ``(bytes, ms)``;
* start-up: seconds from an instance's ``added`` (starting) to its first ``ready``.

:func:`fit_role` turns a snapshot of them into a :class:`RoleFit`, per part:

* fewer than ``min_samples`` samples: the prior's coefficients, confidence 0 (switch);
* otherwise a Huber IRLS fit toward the prior (:func:`~.robust.robust_fit`, the prior as
  ``prior_weight`` pseudo-observations: a blend that the data dominate as they grow). Every
  ``holdout_every``-th sample is held out of a second fit whose median absolute relative
  error on them is the reported error; the served coefficients come from all samples.
* confidence = ``min(1, n / confident_samples) * max(0, 1 - error / max_error)``: it rises
  with the sample count and falls with the held-out error (0 at ``max_error``).

Start-up: the median observed (the prior's ``startup_prior_s`` with none).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from services.common.perfcoef import Coefficients
from services.telemetry.model.robust import Array, median_rel_error, robust_fit

__all__ = ["FitConfig", "PartFit", "RoleFit", "RoleSamples", "fit_role"]


@dataclass(frozen=True)
class FitConfig:
    min_samples: int = 50
    confident_samples: int = 200
    max_samples: int = 4000
    prior_weight: float = 1.0
    holdout_every: int = 5
    max_error: float = 0.5
    startup_prior_s: float = 60.0


@dataclass(frozen=True)
class PartFit:
    """One part of a fit: its coefficients, sample count, held-out error, confidence."""

    coef: tuple[float, ...]
    samples: int
    error: float
    confidence: float


@dataclass(frozen=True)
class RoleFit:
    coefficients: Coefficients
    prefill: PartFit
    decode: PartFit
    transfer: PartFit
    startup_s: float
    startup_samples: int
    fitted_ms: int


class RoleSamples:
    """Bounded recent samples of one deployment x role (no I/O; the shell appends)."""

    def __init__(self, max_samples: int) -> None:
        self.prefill: deque[tuple[float, float, float]] = deque(maxlen=max_samples)
        self.decode: deque[tuple[float, float, float]] = deque(maxlen=max_samples)
        self.decode_fallback: deque[tuple[float, float, float]] = deque(maxlen=max_samples)
        self.transfer: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self.startup: deque[float] = deque(maxlen=max_samples)


def _rows(samples: Sequence[tuple[float, ...]], width: int) -> Array:
    return np.asarray(samples, dtype=np.float64).reshape(len(samples), width)


def _fit_part(x: Array, y: Array, prior: tuple[float, ...], cfg: FitConfig) -> PartFit:
    n = int(x.shape[0])
    if n < cfg.min_samples:
        return PartFit(prior, n, 0.0, 0.0)
    p = np.asarray(prior, dtype=np.float64)
    coef = robust_fit(x, y, p, prior_weight=cfg.prior_weight)
    held = np.zeros(n, dtype=bool)
    held[cfg.holdout_every - 1 :: cfg.holdout_every] = True
    train = robust_fit(x[~held], y[~held], p, prior_weight=cfg.prior_weight)
    err = median_rel_error(x[held], y[held], train)
    conf = min(1.0, n / cfg.confident_samples) * max(0.0, 1.0 - err / cfg.max_error)
    return PartFit(tuple(float(v) for v in coef), n, err, conf)


def _prefill_xy(s: Sequence[tuple[float, float, float]]) -> tuple[Array, Array]:
    r = _rows(s, 3)
    n, q, y = r[:, 0], r[:, 1], r[:, 2]
    return np.column_stack([np.ones_like(n), n + q, n * n]), y


def _decode_xy(s: Sequence[tuple[float, float, float]]) -> tuple[Array, Array]:
    r = _rows(s, 3)
    b, c, y = r[:, 0], r[:, 1], r[:, 2]
    return np.column_stack([np.ones_like(b), b, c / 1000.0]), y


def _transfer_xy(s: Sequence[tuple[float, float]]) -> tuple[Array, Array]:
    r = _rows(s, 2)
    return np.column_stack([np.ones(len(s)), r[:, 0] / 1e6]), r[:, 1]


def fit_role(s: RoleSamples, prior: Coefficients, cfg: FitConfig, now_ms: int) -> RoleFit:
    """The fit of ``s`` (see the module docstring); ``prior`` fills what the data cannot."""
    pp = (prior.prefill_base_ms, prior.prefill_ms_per_token, prior.prefill_ms_per_token2)
    dp = (prior.decode_base_ms, prior.decode_ms_per_seq, prior.decode_ms_per_ktoken)
    tp = (prior.transfer_base_ms, prior.transfer_ms_per_mb)
    prefill = _fit_part(*_prefill_xy(list(s.prefill)), pp, cfg)
    dec_src = s.decode if len(s.decode) >= cfg.min_samples else s.decode_fallback
    if len(dec_src) < len(s.decode):
        dec_src = s.decode
    decode = _fit_part(*_decode_xy(list(dec_src)), dp, cfg)
    transfer = _fit_part(*_transfer_xy(list(s.transfer)), tp, cfg)
    coef = replace(
        prior,
        prefill_base_ms=prefill.coef[0],
        prefill_ms_per_token=prefill.coef[1],
        prefill_ms_per_token2=prefill.coef[2],
        decode_base_ms=decode.coef[0],
        decode_ms_per_seq=decode.coef[1],
        decode_ms_per_ktoken=decode.coef[2],
        transfer_base_ms=transfer.coef[0],
        transfer_ms_per_mb=transfer.coef[1],
    )
    ups = list(s.startup)
    startup = float(np.median(ups)) if ups else cfg.startup_prior_s
    return RoleFit(coef, prefill, decode, transfer, startup, len(ups), now_ms)
