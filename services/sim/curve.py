"""Arrivals from a rate curve (pure apart from reading the curve file).

A rate curve is a CSV with a header and two columns, ``t_s`` (seconds from the start,
increasing) and ``rate_rps`` (requests per second from then on), such as ServeGen's 14-day
10-minute rates (``servegen_language_m-large_rate.csv``). It states how many requests arrive,
not which: each arrival takes the next request of a lengths trace (any trace the simulator
reads), in the trace's order, so its input and output lengths and its prefix ids, and with
them the trace's prefix reuse, are the trace's. The trace repeats with fresh prefix ids when
the curve asks for more requests than it has (:func:`services.sim.inputs.repeated`).

Time: the curve plays ``speedup`` times faster (``--speedup 72`` plays one of its days in
1,200 s), and its rates are multiplied by ``rate_scale`` alone. A curve gives rates, not
requests, so compressing its clock does not raise them, unlike a trace's ``--speedup``, which
sends the same requests in less time. Between two rows the rate is interpolated linearly; the
last row holds for one row step.

Arrivals are an inhomogeneous Poisson process: per second of modelled time, a Poisson count
at that second's mean rate, placed uniformly within it, from a generator seeded with
``seed``; the same inputs give the same arrivals.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from services.common.bench.traces import Trace, TraceError
from services.sim.inputs import repeated

__all__ = ["RateCurve", "curve_trace", "read_curve"]

COLUMNS = ("t_s", "rate_rps")


@dataclass(frozen=True, slots=True)
class RateCurve:
    """Rows of (start second, requests per second); ``t_s`` increasing from 0 up."""

    path: str
    t_s: tuple[float, ...]
    rate_rps: tuple[float, ...]

    @property
    def span_s(self) -> float:
        """The curve's length in its own seconds: the last row holds for one row step."""
        if len(self.t_s) < 2:
            return 1.0
        return self.t_s[-1] + (self.t_s[-1] - self.t_s[-2])

    def head(self, span_s: float) -> RateCurve:
        """The curve's rows that start before ``span_s`` (its own seconds)."""
        keep = [i for i, t in enumerate(self.t_s) if t < span_s] or [0]
        return RateCurve(
            self.path, tuple(self.t_s[i] for i in keep), tuple(self.rate_rps[i] for i in keep)
        )

    def rates_at(self, t_s: np.ndarray) -> np.ndarray:
        """The rate at each curve time in ``t_s`` (linear between rows, the last held)."""
        out: np.ndarray = np.interp(t_s, np.asarray(self.t_s), np.asarray(self.rate_rps))
        return out


def read_curve(path: str | Path) -> RateCurve:
    """The curve in ``path``; raises :class:`TraceError` naming the file and line."""
    src = str(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except OSError as exc:
        raise TraceError(f"{src}: {exc.strerror or exc}") from None
    if not rows or tuple(c.strip() for c in rows[0][:2]) != COLUMNS:
        raise TraceError(f"{src}:1: a rate curve's header is 't_s,rate_rps'")
    ts: list[float] = []
    rates: list[float] = []
    for line, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        try:
            t, rate = float(row[0]), float(row[1])
        except (ValueError, IndexError):
            raise TraceError(f"{src}:{line}: expected two numbers, got {row!r}") from None
        if not (np.isfinite(t) and np.isfinite(rate)) or rate < 0:
            raise TraceError(f"{src}:{line}: t_s and rate_rps must be finite, rate_rps >= 0")
        if ts and t <= ts[-1]:
            raise TraceError(f"{src}:{line}: t_s must increase, {t:g} after {ts[-1]:g}")
        ts.append(t)
        rates.append(rate)
    if not ts:
        raise TraceError(f"{src}: no rows")
    if ts[0] != 0.0:
        raise TraceError(f"{src}:2: the first row's t_s must be 0, got {ts[0]:g}")
    if max(rates) <= 0:
        raise TraceError(f"{src}: every rate is 0")
    return RateCurve(src, tuple(ts), tuple(rates))


def arrival_times(
    curve: RateCurve, *, rate_scale: float, speedup: float, seed: int, limit: int | None
) -> np.ndarray:
    """Arrival times in modelled seconds (sorted), at most ``limit`` of them."""
    span = curve.span_s / speedup
    starts = np.arange(0.0, span, 1.0)
    width = np.minimum(1.0, span - starts)
    mids = (starts + width / 2.0) * speedup
    mean = curve.rates_at(mids) * rate_scale * width
    rng = np.random.default_rng(seed)
    counts = rng.poisson(mean)
    at = np.repeat(starts, counts) + rng.random(int(counts.sum())) * np.repeat(width, counts)
    # within a second the offsets are uniform draws: order them
    at.sort(kind="stable")
    out: np.ndarray = at if limit is None else at[:limit]
    return out


def curve_trace(
    curve: RateCurve,
    lengths: Trace,
    *,
    rate_scale: float = 1.0,
    speedup: float = 1.0,
    seed: int = 0,
    max_requests: int | None = None,
    offset: int = 0,
) -> Trace:
    """A trace whose arrivals follow ``curve`` (arrival_s in modelled seconds: replay it
    with ``rate_scale`` and ``speedup`` 1) and whose requests are ``lengths``' from
    ``offset`` on, in order."""
    if not rate_scale > 0 or not speedup > 0:
        raise ValueError("rate_scale and speedup must be > 0")
    source = lengths.requests[offset:]
    if not source:
        raise TraceError(f"{lengths.path}: no requests after offset {offset}")
    at = arrival_times(curve, rate_scale=rate_scale, speedup=speedup, seed=seed,
                       limit=max_requests)  # fmt: skip
    if not len(at):
        raise TraceError(f"{curve.path}: the curve brings no request at this --rate-scale")
    reqs = tuple(
        replace(r, arrival_s=float(t)) for r, t in zip(repeated(source, len(at)), at, strict=True)
    )
    return Trace(f"{curve.path} (lengths: {lengths.path})", lengths.format, reqs,
                 lengths.block_tokens)  # fmt: skip
