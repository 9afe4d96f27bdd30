"""Autoscaling in the simulation: the autoscaler's pure SLA planner
(:func:`services.common.planner.decide`) ticks on modelled time, fed the window of
what the simulated fleet served, and its targets start and drain simulated instances.

What the planner sees, per tick: a deployment of the fleet's roles (``worker``, or
``prefill`` + ``decode``) between ``min_replicas`` and ``max_replicas``, one SLO class with
the run's TTFT/TPOT targets, the instances (starting, ready; queued requests per ready
instance), and a telemetry window over the last ``window_s`` of modelled time (request
rate, mean input/output tokens, hit ratio, TTFT/TPOT percentiles of the requests that
completed in it). The performance model is the engines' own profile (telemetry's fit would
converge to it), with the engines' KV (``kv_tokens``: the run's ``kv_blocks`` x block size).
With agent memory each instance view carries its sessions' blocks (victim cost) and its
active sessions' prefix tokens, which the planner's scale-in floor keeps room for
(:mod:`services.common.planner.sessionkv`); a draining instance is shown as ``draining``
(not capacity, but its sessions still want room). A new instance serves ``startup_s`` after it is asked for; a victim is
drained (the gateways stop sending, in-flight requests finish) and then removed.

The policy is the autoscaler's own choice, ``planner.policy`` (``sla``: the SLA planner;
``reactive``: the KPA-like baseline, :mod:`services.common.planner.reactive`), and
``planner`` holds any other setting of :class:`PlannerConfig` to run with (e.g. a
deployment spec's ``planner`` section); the tick, window and start-up time are the
simulation's.

The forecast's clock is the load's: a trace replayed ``load_speedup`` times faster has its
day in ``86,400 / load_speedup`` modelled seconds, so the forecast's bucket and season
(``bucket_s``, ``season_s``, in the load's seconds) are divided by it, the bucket no shorter
than a tick (one observation per bucket). Without this a day replayed in 1,200 s is two
of the planner's 600 s buckets and the forecast never sees a climb coming. A ``planner``
setting of either is taken as given, in modelled seconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.common.bench.stats import percentile
from services.common.perfmodel import PerfProfile
from services.common.planner import (
    PlannerConfig,
    PlannerInputs,
    PlannerState,
    WindowView,
    decide,
)
from services.common.planner.core import Decision
from services.common.planner.ports import InstanceView
from services.common.planner.spec import DeploymentSpec, parse_spec

__all__ = ["AutoscaleConfig", "Planner", "Served", "Window"]

DEPLOYMENT = "sim"


@dataclass(frozen=True, slots=True)
class AutoscaleConfig:
    min_replicas: int = 1
    max_replicas: int = 16
    tick_s: float = 10.0
    window_s: float = 60.0
    startup_s: float = 30.0
    ttft_ms: float = 2000.0
    tpot_ms: float = 100.0
    percentile: float = 90.0
    # PlannerConfig settings besides the tick, window and start-up (e.g. policy, predictor,
    # max_utilization), as ``{name: value}``; validated when the planner is made
    planner: tuple[tuple[str, Any], ...] = field(default=())
    # how much faster than recorded the load is replayed (the trace's speedup)
    load_speedup: float = 1.0

    def planner_config(self) -> PlannerConfig:
        """The autoscaler's planner config this run's planner ticks with (raises
        ``ValueError`` for a setting PlannerConfig refuses)."""
        given = dict(self.planner)
        clock: dict[str, float] = {}
        if self.load_speedup != 1.0:
            base = PlannerConfig()
            if "season_s" not in given:
                clock["season_s"] = base.season_s / self.load_speedup
            if "bucket_s" not in given:
                clock["bucket_s"] = max(base.bucket_s / self.load_speedup, self.tick_s)
        return PlannerConfig.model_validate(
            {
                **given,
                **clock,
                "interval_s": self.tick_s,
                "window_s": self.window_s,
                "startup_s_default": self.startup_s,
            }
        )


@dataclass(frozen=True, slots=True)
class Served:
    """One completed request as telemetry records it (ms of modelled time)."""

    end_ms: float
    ttft_ms: float
    tpot_ms: float | None
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int


class Window:
    """The last ``span_ms`` of arrivals and completions (telemetry's window)."""

    def __init__(self, span_ms: float) -> None:
        self.span_ms = span_ms
        self.arrivals: deque[float] = deque()
        self.served: deque[Served] = deque()

    def arrived(self, now: float) -> None:
        self.arrivals.append(now)

    def completed(self, s: Served) -> None:
        self.served.append(s)

    def view(self, now: float) -> WindowView:
        start = now - self.span_ms
        while self.arrivals and self.arrivals[0] < start:
            self.arrivals.popleft()
        while self.served and self.served[0].end_ms < start:
            self.served.popleft()
        done = list(self.served)
        n = len(done)
        span_s = max(min(self.span_ms, now), 1.0) / 1000.0
        prompt = sum(s.prompt_tokens for s in done)
        ttft = sorted(s.ttft_ms for s in done)
        tpot = sorted(s.tpot_ms for s in done if s.tpot_ms is not None)
        return WindowView(
            requests=n,
            rate_rps=len(self.arrivals) / span_s,
            input_tokens=prompt / n if n else 0.0,
            output_tokens=sum(s.output_tokens for s in done) / n if n else 0.0,
            hit_ratio=sum(s.cached_tokens for s in done) / prompt if prompt else 0.0,
            ttft_ms=_percentiles(ttft),
            tpot_ms=_percentiles(tpot),
        )


def _percentiles(xs: list[float]) -> dict[int, float]:
    return {p: percentile(xs, p / 100.0) for p in (50, 90, 99)} if xs else {}


def deployment(roles: Mapping[str, int], cfg: AutoscaleConfig) -> DeploymentSpec:
    """The planner's spec of the simulated fleet (``roles``: initial replicas per role)."""
    return parse_spec(
        {
            "name": DEPLOYMENT,
            "roles": [
                {"name": r, "role": r, "replicas": n,
                 "min_replicas": min(cfg.min_replicas, n), "max_replicas": max(cfg.max_replicas, n)}
                for r, n in roles.items() if n
            ],
            "slo_classes": [
                {"name": "default", "ttft_ms": cfg.ttft_ms, "tpot_ms": cfg.tpot_ms,
                 "percentile": cfg.percentile}
            ],
        }
    )  # fmt: skip


class Planner:
    """The SLA planner and the state it carries between ticks."""

    def __init__(
        self, roles: Mapping[str, int], cfg: AutoscaleConfig, perf: PerfProfile, kv_tokens: int = 0
    ) -> None:
        self.cfg = cfg
        self.kv_tokens = kv_tokens
        self.spec = deployment(roles, cfg)
        self.perf = perf
        self.desired = {r: n for r, n in roles.items() if n}
        self.state = PlannerState()
        self.planner_cfg = cfg.planner_config()
        self.decisions = 0

    def tick(
        self, now_s: float, instances: tuple[InstanceView, ...], window: WindowView
    ) -> Decision:
        inputs = PlannerInputs(
            spec=self.spec,
            desired=self.desired,
            instances=instances,
            window=window,
            perf={r: self.perf for r in self.desired},
            startup_s={r: self.cfg.startup_s for r in self.desired},
            state=self.state,
            kv_tokens={r: self.kv_tokens for r in self.desired if self.kv_tokens},
        )
        d = decide(now_s, inputs, self.planner_cfg)
        self.state, self.desired = d.state, dict(d.targets)
        self.decisions += bool(d.changes)
        return d

    @staticmethod
    def instance(
        iid: str,
        role: str,
        ready: bool,
        queued: int,
        in_flight: int,
        session_blocks: int = 0,
        active_tokens: int = 0,
        draining: bool = False,
    ) -> InstanceView:
        state = "draining" if draining else "ready" if ready else "starting"
        return InstanceView.of(
            iid, DEPLOYMENT, role, state, queued=queued, in_flight=in_flight,
            session_blocks=session_blocks, active_session_tokens=active_tokens,
        )  # fmt: skip
