"""The planner's scale-in floor from the active agent sessions' KV, table-driven: the pure
rule, and the SLA planner's decision with it (a worker role at zero traffic wants 1)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.common.perfcoef import Coefficients
from services.common.planner import PerfView, PlannerConfig, PlannerInputs, PlannerState, on_tick
from services.common.planner.inputs import WindowView
from services.common.planner.ports import InstanceView
from services.common.planner.sessionkv import session_floor
from services.common.planner.spec import parse_spec
from services.common.planner.stability import RoleState


@pytest.mark.parametrize(
    ("active", "kv", "headroom", "want"),
    [
        (0, 100_000, 0.9, 0),  # no active session: no floor
        (500_000, 0, 0.9, 0),  # the instance's KV unknown: no floor
        (90_000, 100_000, 0.9, 1),  # exactly one instance's share
        (90_001, 100_000, 0.9, 2),  # a token more: two
        (1_100_000, 147_200, 0.9, 9),  # the agentic slice: more than 8 engines' share
        (700_000, 147_200, 1.0, 5),  # the whole KV may be used
    ],
    ids=["no-sessions", "kv-unknown", "exact", "one-over", "agentic-slice", "full-kv"],
)
def test_session_floor(active: int, kv: int, headroom: float, want: int) -> None:
    assert session_floor(active, kv, headroom).replicas == want


PERF = PerfView(Coefficients(0.0, 0.1, 0.0, 10.0, 0.5, 0.1, 0.0, 0.0), startup_s=20.0)
SPEC = parse_spec(
    {
        "name": "chat",
        "roles": [
            {"name": "worker", "role": "worker", "replicas": 8, "min_replicas": 2,
             "max_replicas": 8},
        ],
        "slo_classes": [{"name": "default", "ttft_ms": 2000, "tpot_ms": 100}],
    }
)  # fmt: skip
KV = 100_000  # tokens per instance


@dataclass(frozen=True)
class Case:
    id: str
    desired: int
    active_tokens: tuple[int, ...]  # per ready instance
    floor: bool
    target: int
    binding: str


CASES = [
    Case("no-sessions-goes-to-min", 8, (0,) * 8, True, 2, "worker:ttft:default"),
    Case("sessions-hold-the-fleet", 8, (100_000,) * 8, True, 8, "worker:session-kv"),
    Case("scales-in-to-the-floor", 8, (50_000,) * 8, True, 5, "worker:session-kv"),
    Case("a-draining-instance-counts", 8, (50_000,) * 8 + (100_000,), True, 6, "worker:session-kv"),
    Case("below-the-floor-never-scales-out", 3, (200_000,) * 3, True, 3, "worker:session-kv"),
    Case("off-ignores-sessions", 8, (100_000,) * 8, False, 2, "worker:ttft:default"),
]


def _instances(tokens: tuple[int, ...]) -> tuple[InstanceView, ...]:
    def one(i: int, t: int) -> InstanceView:
        state = "ready" if i < 8 else "draining"
        return InstanceView.of(f"w{i}", "chat", "worker", state, active_session_tokens=t)

    return tuple(one(i, t) for i, t in enumerate(tokens))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_planner_holds_the_session_floor(case: Case) -> None:
    inputs = PlannerInputs(
        spec=SPEC,
        desired={"worker": case.desired},
        instances=_instances(case.active_tokens)[: max(case.desired, len(case.active_tokens))],
        window=WindowView(requests=0, rate_rps=0.0, input_tokens=0, output_tokens=0),
        perf={"worker": PERF},
        state=PlannerState(roles={"worker": RoleState(first_seen=0.0)}),
        kv_tokens={"worker": KV},
    )
    cfg = PlannerConfig(predictor="constant", session_kv_floor=case.floor)
    d = on_tick(10_000.0, inputs, cfg)
    assert d.targets["worker"] == case.target
    assert d.binding == case.binding
    if case.binding == "worker:session-kv":
        assert any("session-kv floor" in r for r in d.reasons)


def test_the_perf_models_kv_when_the_inputs_give_none() -> None:
    """Without ``kv_tokens`` the floor divides by the perf model's KV capacity."""
    perf = PerfView(PERF.coef, startup_s=20.0, kv_tokens=KV)
    inputs = PlannerInputs(
        spec=SPEC,
        desired={"worker": 8},
        instances=_instances((50_000,) * 8),
        window=WindowView(requests=0, rate_rps=0.0, input_tokens=0, output_tokens=0),
        perf={"worker": perf},
        state=PlannerState(roles={"worker": RoleState(first_seen=0.0)}),
    )
    d = on_tick(10_000.0, inputs, PlannerConfig(predictor="constant"))
    assert d.targets["worker"] == 5
