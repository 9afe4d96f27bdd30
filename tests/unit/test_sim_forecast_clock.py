"""The simulated planner's forecast runs on the load's clock: a trace replayed N times faster
has its day, and the forecast's buckets, N times shorter."""

from __future__ import annotations

import math

import pytest

from services.common.planner.forecast import new_forecaster, observe, predict
from services.sim import SimConfig
from services.sim.autoscale import AutoscaleConfig
from services.sim.config import SimConfigError


@pytest.mark.parametrize(
    ("auto", "bucket_s", "season_s"),
    [
        (AutoscaleConfig(), 600.0, 86_400.0),
        (AutoscaleConfig(load_speedup=7.2), 600.0 / 7.2, 12_000.0),
        # 8.3 s buckets would leave some without a tick's observation
        (AutoscaleConfig(load_speedup=72.0), 10.0, 1_200.0),
        (AutoscaleConfig(load_speedup=72.0, tick_s=5.0), 600.0 / 72.0, 1_200.0),
        (AutoscaleConfig(load_speedup=72.0, planner=(("bucket_s", 30.0),)), 30.0, 1_200.0),
        (AutoscaleConfig(load_speedup=72.0, planner=(("season_s", 600.0),)), 10.0, 600.0),
        (AutoscaleConfig(load_speedup=0.5), 1_200.0, 172_800.0),
    ],
    ids=["recorded-speed", "7.2x", "72x-a-tick-at-least", "72x-short-ticks",
         "given-bucket", "given-season", "slowed-down"],
)  # fmt: skip
def test_forecast_bucket_and_season_follow_the_load_clock(
    auto: AutoscaleConfig, bucket_s: float, season_s: float
) -> None:
    cfg = auto.planner_config()
    assert cfg.bucket_s == pytest.approx(bucket_s)
    assert cfg.season_s == pytest.approx(season_s)
    assert cfg.interval_s == auto.tick_s


def test_a_non_positive_load_speedup_is_refused() -> None:
    with pytest.raises(SimConfigError, match="speedup"):
        SimConfig(autoscale=AutoscaleConfig(load_speedup=0.0)).validate()


def _growth_on_the_second_days_climb(auto: AutoscaleConfig) -> float:
    """Ticks through two compressed days of a daily sine tide; the forecast's growth over
    the planner's lead early in the second day's climb."""
    cfg = auto.planner_config()
    day_s = 86_400.0 / auto.load_speedup
    f = new_forecaster(cfg)
    growth = 1.0
    climb = day_s + day_s / 16  # early in the second day's rise
    t = 0.0
    while t <= climb:
        f = observe(f, t, 50.0 + 40.0 * math.sin(2 * math.pi * t / day_s))
        t += auto.tick_s
    ahead, now = predict(f, t, auto.startup_s + auto.tick_s), predict(f, t, 0.0)
    if ahead is not None and now:
        growth = ahead / now
    return growth


def test_a_compressed_tide_is_forecast_on_its_own_clock() -> None:
    scaled = AutoscaleConfig(load_speedup=72.0, startup_s=10.0)
    unscaled = AutoscaleConfig(startup_s=10.0)  # a 1,200 s day in 600 s buckets
    assert _growth_on_the_second_days_climb(scaled) > 1.03
    assert _growth_on_the_second_days_climb(unscaled) == pytest.approx(1.0, abs=0.02)
