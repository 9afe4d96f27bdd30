"""The trend of telemetry's windowed request rate, read tick to tick.

Telemetry's rate is the mean over the last ``window_s``. On a steady climb of ``k`` requests
per second per second it trails the current rate by ``k x window_s / 2``, and a replica asked
for now serves only after the lead time. The planner reads ``k`` from successive windows'
rates (smoothed; a gap of more than two ticks starts again from zero), and with
``rate_trend`` on it plans for at least ``rate + max(k, 0) x (window_s / 2 + lead)``. A falling
rate adds nothing: the planner then plans for the window's mean, as without it, and
scale-in stays as slow as its stabilisation makes it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SMOOTHING", "RateTrend", "ahead_of_window", "follow"]

SMOOTHING = 0.5
"""Weight of the newest tick's slope (exponential smoothing of tick-to-tick slopes)."""


@dataclass(frozen=True)
class RateTrend:
    """The last tick's time and rate, and the smoothed slope (req/s per second)."""

    t: float | None = None
    rate: float = 0.0
    slope: float = 0.0


def follow(trend: RateTrend, now: float, rate: float, interval_s: float) -> RateTrend:
    """``trend`` after a tick at ``now`` whose window saw ``rate``."""
    if trend.t is None or not 0 < now - trend.t <= 2 * interval_s:
        return RateTrend(now, rate, 0.0)
    raw = (rate - trend.rate) / (now - trend.t)
    return RateTrend(now, rate, SMOOTHING * raw + (1 - SMOOTHING) * trend.slope)


def ahead_of_window(trend: RateTrend, rate: float, window_s: float, lead_s: float) -> float:
    """The rate a climb along ``trend`` reaches by ``lead_s`` from now, from the window's mean
    ``rate`` (which trails now by half the window); never below ``rate``."""
    return rate + max(trend.slope, 0.0) * (window_s / 2 + lead_s)
