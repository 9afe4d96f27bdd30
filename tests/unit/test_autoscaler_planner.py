"""The SLA planner core: inputs -> decision and reason, table-driven (no mocks).

Perf model used throughout (round numbers): a 1,000-token prompt prefills in 100 ms; a decode
step is 10 ms + 0.5 ms per sequence + 0.1 ms per 1,000 context tokens. With TTFT 1,000 ms
and TPOT 50 ms at p90, 10 req/s of 1,000 in / 100 out tokens offers a prefill load of 1.0
busy replica, for which M/M/c needs 2 prefill replicas, and 0.79 decode replicas (batch 57);
30 req/s needs 4 and 2.37.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from services.common.perfcoef import Coefficients
from services.common.planner import (
    ClassView,
    PerfView,
    PlannerConfig,
    PlannerInputs,
    PlannerState,
    WindowView,
    on_tick,
)
from services.common.planner.forecast import Forecaster, HoltWinters
from services.common.planner.ports import InstanceView
from services.common.planner.spec import parse_spec
from services.common.planner.stability import RoleState

PERF = PerfView(Coefficients(0.0, 0.1, 0.0, 10.0, 0.5, 0.1, 0.0, 0.0), startup_s=20.0)
CFG = PlannerConfig(predictor="constant")
NOW = 10_000.0


def _spec(**over: Any) -> Any:
    data: dict[str, Any] = {
        "name": "chat",
        "roles": [
            {
                "name": "prefill",
                "role": "prefill",
                "replicas": 2,
                "min_replicas": 1,
                "max_replicas": 8,
            },
            {
                "name": "decode",
                "role": "decode",
                "replicas": 1,
                "min_replicas": 1,
                "max_replicas": 8,
            },
        ],
        "slo_classes": [{"name": "interactive", "ttft_ms": 1000, "tpot_ms": 50}],
    }
    data.update(over)
    return parse_spec(data)


def _window(rate: float, **over: Any) -> WindowView:
    base = WindowView(
        requests=int(rate * 60),
        rate_rps=rate,
        input_tokens=1000,
        output_tokens=100,
        ttft_ms={50: 300.0, 90: 600.0, 99: 900.0},
        tpot_ms={50: 20.0, 90: 30.0, 99: 45.0},
    )
    return replace(base, **over)


def _settled() -> PlannerState:
    """Watched long enough, no change for a long time."""
    old = RoleState(first_seen=0.0)
    return PlannerState(roles={"prefill": old, "decode": old})


def _ready(role: str, n: int, **load: int) -> tuple[InstanceView, ...]:
    return tuple(InstanceView.of(f"{role}-{i}", "chat", role, "ready", **load) for i in range(n))


@dataclass(frozen=True)
class Case:
    id: str
    window: WindowView | None
    desired: dict[str, int]
    targets: dict[str, int]
    reason: str
    binding: str = ""
    spec: Any = None
    state: PlannerState = field(default_factory=_settled)
    instances: tuple[InstanceView, ...] = ()
    victims: tuple[str, ...] | None = None


CASES = [
    Case(
        "steady-holds",
        _window(10),
        {"prefill": 2, "decode": 1},
        {"prefill": 2, "decode": 1},
        "prefill: 2 -> 2 (hold)",
        "prefill:ttft:interactive, decode:tpot:interactive",
    ),
    Case(
        "surge-scales-up-at-once",
        _window(30),
        {"prefill": 2, "decode": 1},
        {"prefill": 4, "decode": 3},
        "prefill: 2 -> 4 (up)",
    ),
    Case(
        "zero-traffic-goes-to-min",
        _window(0, requests=0),
        {"prefill": 4, "decode": 3},
        {"prefill": 1, "decode": 1},
        "prefill: 4 -> 1 (down)",
    ),
    Case(
        "at-min-zero-traffic-holds",
        _window(0, requests=0),
        {"prefill": 1, "decode": 1},
        {"prefill": 1, "decode": 1},
        "prefill: 1 -> 1 (hold)",
    ),
    Case(
        "zero-traffic-first-tick-stabilises",
        _window(0, requests=0),
        {"prefill": 4, "decode": 3},
        {"prefill": 4, "decode": 3},
        "(stabilising)",
        state=PlannerState(),
    ),
    Case(
        "cooldown-after-a-change",
        _window(1),
        {"prefill": 4, "decode": 3},
        {"prefill": 4, "decode": 3},
        "prefill: 4 -> 4 (cooldown)",
        state=PlannerState(
            roles={
                "prefill": RoleState(first_seen=0.0, last_change=NOW - 10),
                "decode": RoleState(first_seen=0.0, last_change=NOW - 10),
            }
        ),
    ),
    Case(
        "scale-down-is-step-limited",
        _window(10),
        {"prefill": 8, "decode": 1},
        {"prefill": 6, "decode": 1},
        "prefill: 8 -> 6 (down)",
    ),
    Case(
        "stabilisation-window-keeps-recent-peak",
        _window(10),
        {"prefill": 4, "decode": 3},
        {"prefill": 4, "decode": 3},
        "prefill: 4 -> 4 (hold)",
        state=PlannerState(
            roles={
                "prefill": RoleState(first_seen=0.0, history=((NOW - 60, 4),)),
                "decode": RoleState(first_seen=0.0, history=((NOW - 60, 3),)),
            }
        ),
    ),
    Case(
        "telemetry-outage-holds",
        None,
        {"prefill": 3, "decode": 2},
        {"prefill": 3, "decode": 2},
        "telemetry unavailable (connection refused)",
        "telemetry-outage",
    ),
    Case(
        "attainment-miss-adds-capacity",
        _window(10, ttft_ms={90: 1500.0}),
        {"prefill": 2, "decode": 1},
        {"prefill": 3, "decode": 1},
        "attainment: ttft p90 1500ms > target 1000ms (interactive): +1",
        "prefill:attainment",
        instances=_ready("prefill", 2),
    ),
    Case(
        "attainment-miss-while-starting-waits",
        _window(10, ttft_ms={90: 1500.0}),
        {"prefill": 3, "decode": 1},
        {"prefill": 3, "decode": 1},
        "capacity still arriving, no extra",
        state=PlannerState(
            roles={
                "prefill": RoleState(first_seen=0.0, boost=1),
                "decode": RoleState(first_seen=0.0),
            }
        ),
        instances=(
            *_ready("prefill", 2),
            InstanceView.of("prefill-new", "chat", "prefill", "starting"),
        ),
    ),
    Case(
        "class-percentile-figure-is-used",
        _window(
            10,
            classes=(ClassView("interactive", 1200.0, 30.0),),
        ),
        {"prefill": 2, "decode": 1},
        {"prefill": 3, "decode": 1},
        "ttft p90 1200ms",
    ),
    Case(
        "pending-instances-do-not-cascade",
        _window(30),
        {"prefill": 4, "decode": 3},
        {"prefill": 4, "decode": 3},
        "prefill: 4 -> 4 (hold)",
        instances=(
            *_ready("prefill", 2),
            *(InstanceView.of(f"p-new-{i}", "chat", "prefill", "starting") for i in range(2)),
        ),
    ),
    Case(
        "queue-backlog-adds-replicas",
        _window(10),
        {"prefill": 2, "decode": 1},
        {"prefill": 4, "decode": 1},
        "backlog 600 req",  # drained within the 30 s lead (20 s start-up + a tick): +2
        instances=_ready("prefill", 2, queued=300),
    ),
    Case(
        "warming-instances-backlog-ignored",
        _window(10),
        {"prefill": 2, "decode": 1},
        {"prefill": 2, "decode": 1},
        "prefill: 2 -> 2 (hold)",
        instances=(InstanceView.of("p-w", "chat", "prefill", "starting", queued=50),),
    ),
    Case(
        "max-replicas-binds",
        _window(300),
        {"prefill": 2, "decode": 1},
        {"prefill": 8, "decode": 8},
        "prefill: 2 -> 8 (up)",
        "prefill:max-replicas",
    ),
    Case(
        "pd-ratio-raises-prefill",
        _window(10, input_tokens=100, output_tokens=1000),
        {"prefill": 1, "decode": 1},
        {"prefill": 4, "decode": 8},
        "pd-ratio: prefill raised to 4 for min P:D 0.5",
        spec=_spec(coordination={"min_pd_ratio": 0.5, "max_pd_ratio": 4}),
    ),
    Case(
        "budget-fits-roles",
        _window(30),
        {"prefill": 2, "decode": 1},
        {"prefill": 3, "decode": 3},
        "budget: 7 wanted, 6 kept",
        "budget",
        spec=_spec(budget={"max_replicas": 6}),
    ),
    Case(
        "scale-in-lists-cheapest-victims",
        _window(10),
        {"prefill": 4, "decode": 1},
        {"prefill": 3, "decode": 1},
        "prefill: 4 -> 3 (down)",
        instances=(
            InstanceView.of("p-busy", "chat", "prefill", "ready", in_flight=3),
            InstanceView.of("p-cached", "chat", "prefill", "ready", cached_blocks=500),
            InstanceView.of("p-idle", "chat", "prefill", "ready"),
            InstanceView.of("p-warm", "chat", "prefill", "ready", cached_blocks=5),
        ),
        victims=("p-idle",),
    ),
    Case(
        "scale-in-spares-session-kv",
        _window(10),
        {"prefill": 3, "decode": 1},
        {"prefill": 2, "decode": 1},
        "prefill: 3 -> 2 (down)",
        instances=(
            InstanceView.of("p-agents", "chat", "prefill", "ready", session_blocks=300),
            InstanceView.of("p-few", "chat", "prefill", "ready", session_blocks=20),
            InstanceView.of("p-busy", "chat", "prefill", "ready", in_flight=2),
        ),
        victims=("p-few",),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_on_tick(case: Case) -> None:
    inputs = PlannerInputs(
        spec=case.spec or _spec(),
        desired=case.desired,
        instances=case.instances,
        window=case.window,
        perf={"prefill": PERF, "decode": PERF},
        startup_s={"prefill": 20.0, "decode": 20.0},
        state=case.state,
        telemetry_error="" if case.window else "connection refused",
    )
    d = on_tick(NOW, inputs, CFG)
    assert dict(d.targets) == case.targets, d.reasons
    assert any(case.reason in r for r in d.reasons), d.reasons
    if case.binding:
        assert case.binding in d.binding
    if case.victims is not None:
        assert d.victims == case.victims
    changed = {c.role: (c.from_replicas, c.to_replicas) for c in d.changes}
    assert changed == {
        r: (case.desired[r], t) for r, t in case.targets.items() if t != case.desired[r]
    }


def test_state_carries_to_next_tick_and_scales_down_after_the_window() -> None:
    """A surge, then quiet: up at once, held through the stabilisation window, then down."""
    cfg = PlannerConfig(predictor="constant", scale_down_window_s=300, cooldown_s=120)
    state, desired = PlannerState(), {"prefill": 1, "decode": 1}
    seen: list[tuple[float, int]] = []
    for t in range(0, 1200, 10):
        rate = 30.0 if t < 100 else 1.0
        inputs = PlannerInputs(
            _spec(), desired, (), _window(rate), {"prefill": PERF, "decode": PERF}, {}, state
        )
        d = on_tick(float(t), inputs, cfg)
        state, desired = d.state, dict(d.targets)
        seen.append((t, desired["prefill"]))
    peak_at = min(t for t, n in seen if n == 4)
    first_down = min(t for t, n in seen if t > peak_at and n < 4)
    assert peak_at == 0
    assert first_down >= 90 + 300  # the last busy tick + the stabilisation window
    assert seen[-1][1] == 1


def test_no_perf_model_and_no_profile_holds() -> None:
    inputs = PlannerInputs(_spec(), {"prefill": 2, "decode": 1}, (), _window(30))
    d = on_tick(NOW, inputs, CFG)
    assert dict(d.targets) == {"prefill": 2, "decode": 1}
    assert any("no perf model or perf_profile" in r for r in d.reasons)


def test_the_spec_profile_is_the_prior_without_a_fitted_model() -> None:
    inputs = PlannerInputs(
        _spec(perf_profile="test"), {"prefill": 1, "decode": 1}, (), _window(200), state=_settled()
    )
    d = on_tick(NOW, inputs, CFG)
    assert d.targets["prefill"] > 1
    assert any("(prior:test)" in r for r in d.reasons)


def _rising() -> PlannerState:
    """A forecaster whose season says the next bucket has 3x the current one's traffic
    (buckets of 20 s; bucket 1 closed; the open bucket 2 forecast 5, bucket 3 forecast 15)."""
    hw = HoltWinters(period=2, alpha=0.5, beta=0.0, gamma=0.3, level=10.0, season=(-5.0, 5.0))
    return replace(_settled(), forecaster=Forecaster("holt_winters", 20.0, hw, last_closed=1))


@pytest.mark.parametrize(
    ("observed", "startup_s", "prefill"),
    [(10.0, 15.0, 4), (10.0, 0.0, 2), (0.0, 15.0, 2)],
    ids=["lead-reaches-the-rise", "no-lead-no-rise", "nothing-observed-plans-the-forecast"],
)
def test_lead_time_plans_for_the_forecast_growth(
    observed: float, startup_s: float, prefill: int
) -> None:
    """At t=40 (bucket 2) a 15 s start-up + 10 s tick reaches bucket 3: plan for 3x the
    observed 10 req/s (4 prefill replicas, as for 30 req/s). Without lead time, only the
    observed rate (2). With nothing observed, the forecast's own 15 req/s (2)."""
    cfg = PlannerConfig(
        predictor="holt_winters", bucket_s=20.0, interval_s=10.0, startup_s_default=0.001
    )
    window = _window(observed, requests=int(observed * 60))
    inputs = PlannerInputs(
        _spec(),
        {"prefill": 1, "decode": 1},
        (),
        window,
        {"prefill": PERF, "decode": PERF},
        {"prefill": startup_s or 0.001, "decode": startup_s or 0.001},
        _rising(),
    )
    d = on_tick(40.0, inputs, cfg)
    assert d.targets["prefill"] == prefill, d.reasons
