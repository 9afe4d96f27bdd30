"""Load predictors for the planner: constant, moving average, seasonal Holt-Winters.

Pure and online: a :class:`Forecaster` is a frozen value; ``observe(f, now, rate)`` returns
the next one, ``predict(f, now, horizon_s)`` the rate expected at ``now + horizon_s``.
Observations are averaged into buckets of ``bucket_s`` (a tick every 10 s, a bucket every
10 min); the predictors run on bucket means, one update per closed bucket.

Every forecast's error is scored online: when a bucket closes, the one-bucket-ahead forecast
made when the previous bucket closed is compared with the bucket's actual mean, giving the
mean absolute error and the mean absolute percentage error (``ForecastError``).

Holt-Winters (additive trend and season, period ``m = season_s / bucket_s``): with smoothing
``alpha``, ``beta``, ``gamma`` and ``i`` the bucket's phase in the season::

    level'   = alpha (y - s[i]) + (1 - alpha) (level + trend)
    trend'   = beta (level' - level) + (1 - beta) trend
    s[i]'    = gamma (y - level') + (1 - gamma) s[i]
    forecast(h) = level + h trend + s[(k + h) mod m]

The first season is collected, then ``level`` = its mean, ``trend`` = 0 and ``s[i]`` = each
bucket minus the mean (the classical initialisation); until then it forecasts the last
bucket (constant). Why not statsmodels' ``ExponentialSmoothing``: it fits by numerical
optimisation over the whole history on every call (scipy + pandas, ~100 MB of
dependencies), while the planner needs an O(1) update per bucket inside a pure tick that
carries its state as a value; the recurrences above are those of Hyndman & Athanasopoulos,
"Forecasting: Principles and Practice", section 8.3, and fixed smoothing constants from
config are enough for a daily tide (the benchmark reports the resulting error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from services.common.planner.config import PlannerConfig

__all__ = ["ForecastError", "Forecaster", "error", "new_forecaster", "observe", "predict"]


@dataclass(frozen=True)
class Constant:
    last: float = 0.0

    def update(self, y: float, k: int) -> Constant:
        del k
        return Constant(y)

    def forecast(self, k_last: int, h: int) -> float:
        del k_last, h
        return self.last


@dataclass(frozen=True)
class MovingAverage:
    size: int
    values: tuple[float, ...] = ()

    def update(self, y: float, k: int) -> MovingAverage:
        del k
        return replace(self, values=(*self.values, y)[-self.size :])

    def forecast(self, k_last: int, h: int) -> float:
        del k_last, h
        return sum(self.values) / len(self.values) if self.values else 0.0


@dataclass(frozen=True)
class HoltWinters:
    period: int
    alpha: float
    beta: float
    gamma: float
    warmup: tuple[tuple[int, float], ...] = ()  # (bucket index, mean) of the first season
    level: float = 0.0
    trend: float = 0.0
    season: tuple[float, ...] = ()  # indexed by bucket index mod period

    def update(self, y: float, k: int) -> HoltWinters:
        if not self.season:
            warm = (*self.warmup, (k, y))
            if len(warm) < self.period:
                return replace(self, warmup=warm, level=y)
            mean = sum(v for _, v in warm) / len(warm)
            season = [0.0] * self.period
            for idx, v in warm:
                season[idx % self.period] = v - mean
            return replace(self, warmup=(), level=mean, trend=0.0, season=tuple(season))
        i = k % self.period
        s = self.season[i]
        level = self.alpha * (y - s) + (1 - self.alpha) * (self.level + self.trend)
        trend = self.beta * (level - self.level) + (1 - self.beta) * self.trend
        season = list(self.season)
        season[i] = self.gamma * (y - level) + (1 - self.gamma) * s
        return replace(self, level=level, trend=trend, season=tuple(season))

    def forecast(self, k_last: int, h: int) -> float:
        if not self.season:
            return self.level
        return self.level + h * self.trend + self.season[(k_last + h) % self.period]


Predictor = Constant | MovingAverage | HoltWinters


@dataclass(frozen=True)
class ForecastError:
    """Online score of the one-bucket-ahead forecasts (``scored`` buckets so far)."""

    mae: float
    mape: float
    scored: int


@dataclass(frozen=True)
class Forecaster:
    name: str
    bucket_s: float
    predictor: Predictor
    bucket: int | None = None  # index of the open bucket
    acc_sum: float = 0.0
    acc_n: int = 0
    last_closed: int | None = None
    pending: float | None = None  # forecast for the bucket after last_closed
    abs_err: float = 0.0
    abs_pct_err: float = 0.0
    pct_scored: int = 0
    scored: int = 0


def new_forecaster(cfg: PlannerConfig) -> Forecaster:
    predictor: Predictor
    if cfg.predictor == "constant":
        predictor = Constant()
    elif cfg.predictor == "moving_average":
        predictor = MovingAverage(cfg.moving_average_buckets)
    else:
        period = max(2, round(cfg.season_s / cfg.bucket_s))
        predictor = HoltWinters(period, cfg.hw_alpha, cfg.hw_beta, cfg.hw_gamma)
    return Forecaster(cfg.predictor, cfg.bucket_s, predictor)


def _close(f: Forecaster) -> Forecaster:
    if f.bucket is None or f.acc_n == 0:
        return f
    y = f.acc_sum / f.acc_n
    abs_err, pct, pct_n, scored = f.abs_err, f.abs_pct_err, f.pct_scored, f.scored
    if f.pending is not None and f.last_closed == f.bucket - 1:
        abs_err += abs(f.pending - y)
        scored += 1
        if y > 0:
            pct += abs(f.pending - y) / y
            pct_n += 1
    predictor = f.predictor.update(y, f.bucket)
    return replace(
        f,
        predictor=predictor,
        last_closed=f.bucket,
        pending=max(0.0, predictor.forecast(f.bucket, 1)),
        abs_err=abs_err,
        abs_pct_err=pct,
        pct_scored=pct_n,
        scored=scored,
    )


def observe(f: Forecaster, now: float, value: float) -> Forecaster:
    """Add one observation (e.g. the window's request rate) taken at ``now``."""
    k = math.floor(now / f.bucket_s)
    if f.bucket is not None and k < f.bucket:
        return f  # a clock going backwards: ignore the sample
    if f.bucket is not None and k > f.bucket:
        f = replace(_close(f), bucket=k, acc_sum=0.0, acc_n=0)
    elif f.bucket is None:
        f = replace(f, bucket=k)
    return replace(f, acc_sum=f.acc_sum + value, acc_n=f.acc_n + 1)


def predict(f: Forecaster, now: float, horizon_s: float) -> float | None:
    """The rate expected at ``now + horizon_s``; None before the first closed bucket."""
    if f.last_closed is None:
        return None
    h = max(1, math.floor((now + horizon_s) / f.bucket_s) - f.last_closed)
    return max(0.0, f.predictor.forecast(f.last_closed, h))


def error(f: Forecaster) -> ForecastError:
    return ForecastError(
        mae=f.abs_err / f.scored if f.scored else 0.0,
        mape=f.abs_pct_err / f.pct_scored if f.pct_scored else 0.0,
        scored=f.scored,
    )
