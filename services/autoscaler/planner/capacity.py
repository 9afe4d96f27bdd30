"""Replicas a role needs for a demand at the SLO targets (pure; fractional, ceil'd later).

Rules:

* **Prefill** (and the prefill share of an aggregated worker). A replica prefills a mean
  request's uncached tokens ``n = input * (1 - hit)`` in ``s = prefill_ms(n)``. Queueing as
  M/M/1 (conservative for near-deterministic service): the waiting time's p-th percentile is
  ``s * rho / (1 - rho) * ln(1 / (1 - p))``, so TTFT_p <= target needs
  ``rho <= r / (1 + r)`` with ``r = (target - s) / (s * ln(1 / (1 - p)))``, capped by
  ``max_utilization``. Need = ``rate * s / 1000 / rho``. A queue backlog adds what drains
  it within the target: ``backlog * s / target``.
* **Decode** (and the decode share of a worker). Little's law: concurrency =
  ``rate * output * tpot`` with steps at the target. A replica holds the largest batch ``b``
  whose step ``decode_step_ms(b, b * ctx)`` fits in ``target * decode_headroom`` (``ctx`` =
  input + output / 2, the mean context while decoding). Need = concurrency / b.
* **Worker** (aggregated): prefill and decode share the replica's time, so the needs add.

A target of 0 (none) sizes by throughput alone (``max_utilization``, and for decode the
batch whose step is at most 4x the batch-1 step). An unreachable target (one request alone
takes longer) is flagged ``feasible=False`` and sized at the utilisation ceiling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Demand", "Need", "PerfLike", "Targets", "decode_need", "prefill_need"]


class PerfLike(Protocol):
    """Step times of one replica (``services.common.perfmodel.PerfProfile`` is one; so is
    the telemetry's fitted model through :class:`services.autoscaler.planner.inputs.PerfView`)."""

    def prefill_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float: ...

    def decode_step_ms(self, batch: int, context_tokens: int) -> float: ...


@dataclass(frozen=True)
class Demand:
    rate_rps: float
    input_tokens: float
    output_tokens: float
    hit_ratio: float = 0.0
    backlog: float = 0.0  # requests queued now, waiting for prefill


@dataclass(frozen=True)
class Targets:
    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    percentile: float = 90.0


@dataclass(frozen=True)
class Need:
    replicas: float  # fractional
    feasible: bool
    detail: str


def _rho(service_ms: float, target_ms: float, percentile: float, ceiling: float) -> float:
    if target_ms <= 0:
        return ceiling
    if target_ms <= service_ms:
        return 0.0
    tail = math.log(1.0 / max(1e-9, 1.0 - percentile / 100.0))
    r = (target_ms - service_ms) / (service_ms * max(tail, 1e-9))
    return min(ceiling, r / (1.0 + r))


def prefill_need(perf: PerfLike, d: Demand, t: Targets, max_utilization: float) -> Need:
    uncached = max(1, round(d.input_tokens * (1.0 - d.hit_ratio)))
    s = perf.prefill_ms(uncached)
    rho = _rho(s, t.ttft_ms, t.percentile, max_utilization)
    feasible = rho > 0
    rho = rho if feasible else max_utilization
    need = d.rate_rps * s / 1000.0 / rho
    backlog = d.backlog * s / t.ttft_ms if t.ttft_ms > 0 and d.backlog > 0 else 0.0
    detail = (
        f"{d.rate_rps:.2f} req/s x {uncached} uncached tok ({s:.1f} ms) at rho {rho:.2f}"
        + (f" + backlog {d.backlog:.0f} req" if backlog else "")
        + ("" if feasible else f"; ttft target {t.ttft_ms:g} ms < one prefill {s:.1f} ms")
    )
    return Need(need + backlog, feasible, detail)


def _max_batch(perf: PerfLike, ctx: int, budget_ms: float) -> int:
    lo, hi = 0, 1
    while hi <= 1 << 16 and perf.decode_step_ms(hi, hi * ctx) <= budget_ms:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # largest b with step(b) <= budget in (lo, hi)
        mid = (lo + hi) // 2
        if perf.decode_step_ms(mid, mid * ctx) <= budget_ms:
            lo = mid
        else:
            hi = mid
    return lo


def decode_need(perf: PerfLike, d: Demand, t: Targets, headroom: float) -> Need:
    ctx = max(1, round(d.input_tokens + d.output_tokens / 2))
    budget = t.tpot_ms * headroom if t.tpot_ms > 0 else 4.0 * perf.decode_step_ms(1, ctx)
    batch = _max_batch(perf, ctx, budget)
    feasible = batch > 0
    step = budget if feasible else perf.decode_step_ms(1, ctx)
    concurrency = d.rate_rps * d.output_tokens * step / 1000.0
    need = concurrency / max(1, batch)
    detail = f"concurrency {concurrency:.1f} / batch {batch} at step <= {step:.1f} ms" + (
        "" if feasible else f"; tpot target {t.tpot_ms:g} ms < one step"
    )
    return Need(need, feasible, detail)
