"""The reactive (KPA-like) policy core: inputs -> decision and reason, table-driven (no mocks).

Most cases use one worker role, a target of 1 request in flight per replica
(``target_concurrency`` 1 at utilisation 1), and windows with no output tokens, so the
concurrency is rate x TTFT p50: 10 req/s at 300 ms = 3 in flight = 3 replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from services.common.perfcoef import Coefficients
from services.common.planner import (
    PerfView,
    PlannerConfig,
    PlannerInputs,
    PlannerState,
    ReactiveConfig,
    WindowView,
    decide,
)
from services.common.planner.inputs import ReactiveState
from services.common.planner.ports import InstanceView
from services.common.planner.reactive import concurrency, per_replica
from services.common.planner.spec import parse_spec

NOW = 1_000.0
# 1,000-token prompt: 100 ms of prefill; decode step 10 ms + 0.5 ms/seq + 0.1 ms/1,000 ctx
PERF = PerfView(Coefficients(0.0, 0.1, 0.0, 10.0, 0.5, 0.1, 0.0, 0.0), startup_s=5.0)
UNIT = ReactiveConfig(target_concurrency=1.0, target_utilization=1.0)


def _cfg(**over: Any) -> PlannerConfig:
    return PlannerConfig(policy="reactive", reactive=UNIT.model_copy(update=over))


def _spec(max_replicas: int = 8) -> Any:
    return parse_spec(
        {
            "name": "chat",
            "roles": [
                {"name": "worker", "role": "worker", "replicas": 2, "min_replicas": 1,
                 "max_replicas": max_replicas},
            ],
            "slo_classes": [{"name": "interactive", "ttft_ms": 1000, "tpot_ms": 50}],
        }
    )  # fmt: skip


def _window(in_flight: float) -> WindowView:
    """A window whose worker concurrency is ``in_flight`` (10 req/s x TTFT p50)."""
    return WindowView(
        requests=100 if in_flight else 0,
        rate_rps=10.0 if in_flight else 0.0,
        input_tokens=1000,
        output_tokens=0,
        ttft_ms={50: in_flight * 100.0, 90: in_flight * 200.0},
        tpot_ms={50: 20.0, 90: 30.0},
    )


def _instances(ready: int, starting: int = 0, in_flight: int = 0) -> tuple[InstanceView, ...]:
    return tuple(
        InstanceView.of(
            f"w{k}", "chat", "worker", "ready" if k < ready else "starting",
            in_flight=in_flight if k < ready else 0, queued=in_flight if k < ready else 0,
        )
        for k in range(ready + starting)
    )  # fmt: skip


@dataclass(frozen=True)
class Case:
    id: str
    in_flight: float | None  # None = telemetry outage
    desired: int
    ready: int
    target: int
    reason: str
    binding: str = "worker:reactive-stable"
    starting: int = 0
    state: ReactiveState = field(default_factory=ReactiveState)
    cfg: PlannerConfig = field(default_factory=_cfg)
    max_replicas: int = 8
    victims: tuple[str, ...] = ()
    engines_report: int = 0  # running = queued = this, per ready instance


CASES = [
    Case("holds-at-target", 2.0, 2, 2, 2, "worker: 2 -> 2 (reactive stable"),
    Case("stable-up", 3.0, 2, 2, 3, "concurrency 3.00 stable / 3.00 panic at 1.00 per replica -> 3"),
    Case(
        "panic-up-at-2x-ready", 5.0, 2, 2, 5, "worker: 2 -> 5 (reactive panic",
        binding="worker:reactive-panic",
    ),
    Case(
        "up-rate-bounded", 10.0, 2, 2, 3, "rate-bounded to 3 (ready 2)",
        binding="worker:reactive-panic", cfg=_cfg(max_scale_up_rate=1.5),
    ),
    Case(
        "no-shrink-while-panicking", 1.0, 6, 6, 6, "reactive panic",
        binding="worker:reactive-panic", state=ReactiveState(panic_until=NOW + 30),
    ),
    Case(
        "panic-over-stable-down", 1.0, 6, 6, 3, "worker: 6 -> 3",
        state=ReactiveState(panic_until=NOW - 1), cfg=_cfg(max_scale_down_rate=2.0),
        victims=("w0", "w1", "w2"),
    ),
    Case(
        "stable-window-averages", 1.0, 4, 4, 3, "concurrency 3.00 stable / 1.00 panic",
        state=ReactiveState(samples=((NOW - 30, 4.0), (NOW - 10, 4.0))), victims=("w0",),
    ),
    Case(
        "old-samples-dropped", 2.0, 2, 2, 2, "concurrency 2.00 stable",
        state=ReactiveState(samples=((NOW - 100, 10.0),)),
    ),
    Case("down-rate-bounded", 0.0, 8, 8, 4, "rate-bounded to 4 (ready 8)", victims=("w0", "w1", "w2", "w3")),
    Case(
        "zero-traffic-to-min", 0.0, 2, 1, 1, "worker: 2 -> 1", binding="worker:min-replicas",
        starting=1, victims=("w1",),
    ),
    Case(
        "starting-ignored-and-removed-first", 3.0, 4, 2, 3, "worker: 4 -> 3", starting=2,
        victims=("w2",),
    ),
    Case(
        "engines-report-more-than-the-window", 1.0, 2, 2, 4, "concurrency 4.00 stable",
        binding="worker:reactive-panic", engines_report=1,
    ),
    Case("max-replicas", 12.0, 6, 6, 8, "worker: 6 -> 8", binding="worker:max-replicas", max_replicas=8),
    Case(
        "telemetry-outage-holds", None, 3, 3, 3, "telemetry unavailable (down)",
        binding="telemetry-outage",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reactive_tick(case: Case) -> None:
    inputs = PlannerInputs(
        spec=_spec(case.max_replicas),
        desired={"worker": case.desired},
        instances=_instances(case.ready, case.starting, case.engines_report),
        window=None if case.in_flight is None else _window(case.in_flight),
        perf={"worker": PERF},
        state=PlannerState(reactive={"worker": case.state}),
        telemetry_error="down",
    )
    d = decide(NOW, inputs, case.cfg)
    assert d.targets == {"worker": case.target}
    assert any(case.reason in r for r in d.reasons), d.reasons
    assert d.binding == case.binding
    assert d.victims == case.victims
    if case.in_flight is not None:
        seen = max(case.in_flight, 2.0 * case.engines_report * case.ready)
        assert d.state.reactive["worker"].samples[-1] == (NOW, pytest.approx(seen))


def test_panic_lasts_a_stable_window_after_it_started() -> None:
    cfg = _cfg(stable_window_s=60.0)
    inputs = PlannerInputs(
        spec=_spec(), desired={"worker": 2}, instances=_instances(2), window=_window(5.0),
        perf={"worker": PERF},
    )  # fmt: skip
    d = decide(NOW, inputs, cfg)
    assert d.state.reactive["worker"].panic_until == NOW + 60.0


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("prefill", 0.7),  # one prompt at a time
        ("decode", 57 * 0.7),  # step(57) = 10 + 0.605 * 57 = 44.5 ms <= 50 x 0.9
        ("worker", (1 + 100 * 10.605 / 100) * 0.7),  # decode of 100 tokens rides along
        ("worker-step-capped-at-tpot", (1 + 100 * 5.0 / 100) * 0.7),
    ],
    ids=["prefill", "decode", "worker", "worker-step-capped-at-tpot"],
)
def test_target_per_replica_derived_from_the_model(kind: str, expected: float) -> None:
    w = WindowView(10, 1.0, input_tokens=1000, output_tokens=100)
    spec = _spec()
    if kind == "worker-step-capped-at-tpot":
        kind = "worker"
        classes = [spec.slo_classes[0].model_copy(update={"tpot_ms": 5.0})]
        spec = spec.model_copy(update={"slo_classes": tuple(classes)})
    got = per_replica(kind, PERF, w, spec, PlannerConfig(policy="reactive"))
    assert got == pytest.approx(expected)


def test_no_model_and_no_target_holds() -> None:
    inputs = PlannerInputs(
        spec=_spec(), desired={"worker": 3}, instances=_instances(3), window=_window(9.0)
    )
    d = decide(NOW, inputs, PlannerConfig(policy="reactive"))
    assert d.targets == {"worker": 3}
    assert "no perf model, no target" in d.reasons[0]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("prefill", 3.0), ("decode", 2.0), ("worker", 5.0), ("kvcache", 0.0)],
    ids=["prefill", "decode", "worker", "kvcache"],
)
def test_concurrency_by_littles_law(kind: str, expected: float) -> None:
    w = WindowView(100, 10.0, 1000, 10, ttft_ms={50: 300.0}, tpot_ms={50: 20.0})
    assert concurrency(kind, w) == pytest.approx(expected)
    assert math.isclose(concurrency(kind, WindowView(0, 0.0, 0, 0)), 0.0)


@pytest.mark.parametrize("policy", ["sla", "reactive"], ids=["sla", "reactive"])
def test_a_pinned_role_is_held_by_every_policy(policy: str) -> None:
    """A manual scale pins the role (``tideserve scale``): 12 in flight would want 8."""
    inputs = PlannerInputs(
        spec=_spec(), desired={"worker": 2}, instances=_instances(2), window=_window(12.0),
        perf={"worker": PERF}, pins={"worker": 2},
    )  # fmt: skip
    cfg = _cfg() if policy == "reactive" else PlannerConfig(predictor="constant")
    d = decide(NOW, inputs, cfg)
    assert d.targets == {"worker": 2} and d.changes == ()
    assert "manual pin: worker 2" in d.reasons[-1] and d.binding.endswith("manual")
