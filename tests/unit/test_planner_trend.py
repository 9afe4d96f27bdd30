"""The windowed rate's trend: read tick to tick, and what the planner plans for with it."""

from __future__ import annotations

import pytest

from services.common.perfcoef import Coefficients
from services.common.planner import (
    PerfView,
    PlannerConfig,
    PlannerInputs,
    PlannerState,
    WindowView,
    on_tick,
)
from services.common.planner.spec import parse_spec
from services.common.planner.trend import SMOOTHING, RateTrend, ahead_of_window, follow

TICK = 10.0


@pytest.mark.parametrize(
    ("ticks", "slope"),
    [
        ([(0.0, 50.0)], 0.0),
        ([(0.0, 50.0), (10.0, 60.0)], SMOOTHING * 1.0),
        ([(0.0, 50.0), (10.0, 60.0), (20.0, 70.0)], SMOOTHING * 1.0 + (1 - SMOOTHING) * SMOOTHING),
        ([(0.0, 60.0), (10.0, 50.0)], -SMOOTHING * 1.0),
        ([(0.0, 50.0), (10.0, 60.0), (40.0, 90.0)], 0.0),  # a gap of three ticks: start again
        ([(0.0, 50.0), (0.0, 60.0)], 0.0),  # the same instant twice
        ([(10.0, 50.0), (0.0, 60.0)], 0.0),  # time going back
    ],
    ids=["first-tick", "one-climb", "steady-climb", "falling", "gap-resets",
         "same-instant", "backwards"],
)  # fmt: skip
def test_follow(ticks: list[tuple[float, float]], slope: float) -> None:
    trend = RateTrend()
    for now, rate in ticks:
        trend = follow(trend, now, rate, TICK)
    assert trend.slope == pytest.approx(slope)
    assert (trend.t, trend.rate) == ticks[-1]


@pytest.mark.parametrize(
    ("slope", "want"),
    [(0.5, 60.0 + 0.5 * (30.0 + 20.0)), (0.0, 60.0), (-0.5, 60.0)],
    ids=["climbing", "flat", "falling-plans-the-mean"],
)
def test_ahead_of_window(slope: float, want: float) -> None:
    assert ahead_of_window(RateTrend(0.0, 60.0, slope), 60.0, 60.0, 20.0) == pytest.approx(want)


SPEC = parse_spec({
    "name": "chat",
    "roles": [{"name": "prefill", "role": "prefill", "replicas": 2, "min_replicas": 1,
               "max_replicas": 32}],
    "slo_classes": [{"name": "interactive", "ttft_ms": 1000, "tpot_ms": 50}],
})  # fmt: skip
PERF = PerfView(Coefficients(0.0, 0.1, 0.0, 10.0, 0.5, 0.1, 0.0, 0.0), startup_s=20.0)


def _climb(rate_trend: bool) -> tuple[int, float]:
    """Ticks through a climb of 1 req/s per second (the window's rate, 10 s apart); the
    prefill target and the trend at the last tick."""
    cfg = PlannerConfig(predictor="constant", rate_trend=rate_trend)
    state, desired, slope = PlannerState(), {"prefill": 2}, 0.0
    for k in range(6):
        w = WindowView(requests=600, rate_rps=10.0 + 10.0 * k, input_tokens=1000, output_tokens=100)
        inputs = PlannerInputs(spec=SPEC, desired=desired, instances=(), window=w,
                               perf={"prefill": PERF}, state=state)  # fmt: skip
        d = on_tick(1_000.0 + TICK * k, inputs, cfg)
        state, desired = d.state, dict(d.targets)
        slope = d.forecast["horizons"]["prefill"]["trend"]
    return desired["prefill"], slope


def test_a_climb_is_planned_ahead_only_with_rate_trend() -> None:
    without, slope = _climb(rate_trend=False)
    with_trend, slope_on = _climb(rate_trend=True)
    assert slope == slope_on > 0.9  # followed either way, shown in the decision
    # 60 req/s from the window; along the climb (30 s behind + 30 s lead) about 120 req/s
    assert with_trend > without
