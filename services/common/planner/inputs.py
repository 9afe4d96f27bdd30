"""What the planner core sees on a tick (frozen snapshots; built by the loop shell)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.common.perfcoef import Coefficients
from services.common.planner.capacity import PerfLike
from services.common.planner.forecast import Forecaster
from services.common.planner.ports import InstanceView
from services.common.planner.spec import DeploymentSpec
from services.common.planner.stability import RoleState
from services.common.planner.trend import RateTrend

__all__ = [
    "ClassView",
    "PerfView",
    "PlannerInputs",
    "PlannerState",
    "ReactiveState",
    "WindowView",
]


@dataclass(frozen=True)
class ClassView:
    """Observed latency of one SLO class at the percentile it names."""

    name: str
    ttft_ms: float
    tpot_ms: float


@dataclass(frozen=True)
class WindowView:
    """Telemetry over the last window (a deployment's total)."""

    requests: int
    rate_rps: float
    input_tokens: float  # mean per request
    output_tokens: float
    hit_ratio: float = 0.0
    ttft_ms: Mapping[int, float] = field(default_factory=dict)  # {50: p50, 90: p90, 99: p99}
    tpot_ms: Mapping[int, float] = field(default_factory=dict)
    classes: tuple[ClassView, ...] = ()

    def at(self, metric: str, percentile: float, slo_class: str = "") -> float | None:
        """Observed ``metric`` ("ttft"/"tpot") at ``percentile``: the class's own figure
        when telemetry reports it, else the nearest reported percentile at or above it."""
        for c in self.classes:
            if c.name == slo_class:
                return c.ttft_ms if metric == "ttft" else c.tpot_ms
        table = self.ttft_ms if metric == "ttft" else self.tpot_ms
        above = sorted(p for p in table if p >= percentile)
        if above:
            return table[above[0]]
        return table[max(table)] if table else None


@dataclass(frozen=True)
class PerfView:
    """Telemetry's fitted performance model of a role: the ``PerfModel`` proto's
    coefficients (:class:`~services.common.perfcoef.Coefficients`) and the measured
    start-up time. A prompt with nothing uncached costs no prefill."""

    coef: Coefficients
    startup_s: float = 0.0
    kv_tokens: int = 0
    """KV tokens one replica holds (0: unknown; the fit does not learn it)."""

    def prefill_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
        del cached_tokens
        return self.coef.prefill_ms(uncached_tokens) if uncached_tokens > 0 else 0.0

    def decode_step_ms(self, batch: int, context_tokens: int) -> float:
        return self.coef.decode_step_ms(batch, context_tokens)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_tokens


@dataclass(frozen=True)
class ReactiveState:
    """One role under the reactive policy: concurrency samples ``(ts, requests in flight)``
    within the stable window, and until when it panics (-inf = not panicking)."""

    samples: tuple[tuple[float, float], ...] = ()
    panic_until: float = -math.inf


@dataclass(frozen=True)
class PlannerState:
    """What the planner carries from one tick to the next (a value, never mutated)."""

    forecaster: Forecaster | None = None
    roles: Mapping[str, RoleState] = field(default_factory=dict)
    reactive: Mapping[str, ReactiveState] = field(default_factory=dict)
    trend: RateTrend = field(default_factory=RateTrend)


@dataclass(frozen=True)
class PlannerInputs:
    """A tick's snapshot. ``window`` None = telemetry unreachable (``telemetry_error`` says
    why); ``perf`` maps role kind ("prefill", "decode", "worker") to its model, and a kind
    without one falls back to the spec's ``perf_profile`` prior; ``startup_s`` is each role
    kind's measured start-up time (lead time); ``pins`` are roles a manual scale pinned
    (``{role: replicas}``), which every policy holds there; ``kv_tokens`` is the KV tokens
    one instance of a role kind holds (absent or 0: the perf model's), which the scale-in
    floor of the active sessions' KV divides by (:mod:`.sessionkv`)."""

    spec: DeploymentSpec
    desired: Mapping[str, int]
    instances: tuple[InstanceView, ...]
    window: WindowView | None
    perf: Mapping[str, PerfLike] = field(default_factory=dict)
    startup_s: Mapping[str, float] = field(default_factory=dict)
    state: PlannerState = PlannerState()
    telemetry_error: str = ""
    pins: Mapping[str, int] = field(default_factory=dict)
    kv_tokens: Mapping[str, int] = field(default_factory=dict)
