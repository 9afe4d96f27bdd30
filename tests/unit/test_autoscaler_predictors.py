"""Load predictors, their online error score, co-location and victim rules (pure)."""

from __future__ import annotations

import math

import pytest

from services.common.planner import Claim, PlannerConfig, allocate, fit_roles
from services.common.planner.capacity import erlang_c
from services.common.planner.forecast import error, new_forecaster, observe, predict
from services.common.planner.ports import InstanceView
from services.common.planner.spec import parse_spec
from services.common.planner.victims import pick_victims


def _tide(t: float, day: float) -> float:
    return 100.0 + 60.0 * math.sin(2 * math.pi * t / day)


def _run(predictor: str, days: int = 4, day: float = 2400.0) -> float:
    cfg = PlannerConfig(predictor=predictor, bucket_s=100.0, season_s=day)
    f = new_forecaster(cfg)
    for t in range(0, int(days * day), 10):
        f = observe(f, float(t), _tide(t, day))
    return error(f).mape


@pytest.mark.parametrize(
    ("values", "predictor", "expected"),
    [
        ((10.0, 20.0, 30.0), "constant", 20.0),
        ((10.0, 20.0, 30.0), "moving_average", 15.0),  # buckets 10 and 20 closed; window 6
        ((5.0,), "constant", None),  # nothing closed yet
    ],
    ids=["constant-last-bucket", "moving-average", "none-before-first-bucket"],
)
def test_predict(values: tuple[float, ...], predictor: str, expected: float | None) -> None:
    f = new_forecaster(PlannerConfig(predictor=predictor, bucket_s=10.0))
    for i, v in enumerate(values):
        f = observe(f, i * 10.0 + 1, v)
    assert predict(f, len(values) * 10.0, 5.0) == expected


def test_error_is_scored_against_the_next_bucket() -> None:
    f = new_forecaster(PlannerConfig(predictor="constant", bucket_s=10.0))
    for i, v in enumerate((10.0, 20.0, 20.0, 0.0)):
        f = observe(f, i * 10.0, v)
    # scored: bucket 1 (pred 10, actual 20), bucket 2 (pred 20, actual 20)
    e = error(f)
    assert (e.scored, e.mae, e.mape) == (2, 5.0, 0.25)


def test_holt_winters_learns_the_daily_tide_better_than_flat_predictors() -> None:
    hw, ma, const = _run("holt_winters"), _run("moving_average"), _run("constant")
    assert hw < 0.5 * const
    assert hw < ma


def test_holt_winters_forecasts_the_seasonal_peak_ahead() -> None:
    day = 2400.0
    cfg = PlannerConfig(predictor="holt_winters", bucket_s=100.0, season_s=day)
    f = new_forecaster(cfg)
    for t in range(0, int(3 * day), 10):
        f = observe(f, float(t), _tide(t, day))
    now = 3 * day  # the trough is 3/4 day on; the peak 1/4
    peak = predict(f, now, day / 4)
    trough = predict(f, now, 3 * day / 4)
    assert peak is not None and trough is not None
    assert peak == pytest.approx(160.0, rel=0.1)
    assert trough == pytest.approx(40.0, rel=0.2)


@pytest.mark.parametrize(
    ("budget", "claims", "expected"),
    [
        (10, [Claim("a", 10, 1, 4), Claim("b", 0, 1, 4)], {"a": 4, "b": 4}),
        (6, [Claim("a", 10, 1, 5), Claim("b", 0, 1, 5)], {"a": 5, "b": 1}),
        (6, [Claim("a", 10, 1, 1), Claim("b", 0, 1, 8)], {"a": 1, "b": 5}),
        (3, [Claim("a", 10, 2, 5), Claim("b", 0, 2, 5)], {"a": 2, "b": 2}),
        (8, [Claim("b", 5, 1, 6), Claim("a", 5, 1, 6)], {"a": 6, "b": 2}),
    ],
    ids=["fits", "reclaim-lowest-priority", "ebb-lends", "floors-always", "tie-by-name"],
)
def test_allocate(budget: int, claims: list[Claim], expected: dict[str, int]) -> None:
    assert allocate(budget, claims) == expected


def _pd(lo: float = 0.0, hi: float = 0.0) -> object:
    return parse_spec(
        {
            "name": "x",
            "roles": [
                {"name": "p", "role": "prefill", "min_replicas": 1, "max_replicas": 9},
                {"name": "d", "role": "decode", "min_replicas": 1, "max_replicas": 9},
            ],
            "coordination": {"min_pd_ratio": lo, "max_pd_ratio": hi},
        }
    )


@pytest.mark.parametrize(
    ("lo", "hi", "targets", "limit", "expected"),
    [
        (0, 0, {"p": 6, "d": 2}, 5, {"p": 3, "d": 2}),
        (0, 0, {"p": 4, "d": 4}, 4, {"p": 2, "d": 2}),
        (0.5, 2, {"p": 2, "d": 6}, 6, {"p": 2, "d": 4}),
        (1, 1, {"p": 4, "d": 4}, 5, {"p": 3, "d": 2}),
        (0, 0, {"p": 2, "d": 2}, 1, {"p": 1, "d": 1}),
    ],
    ids=["largest-first", "alternate", "ratio-kept", "ratio-impossible-nearest", "never-below-min"],
)
def test_fit_roles(
    lo: float, hi: float, targets: dict[str, int], limit: int, expected: dict[str, int]
) -> None:
    assert fit_roles(_pd(lo, hi), targets, limit) == expected  # type: ignore[arg-type]


def _inst(iid: str, state: str = "ready", **load: int) -> InstanceView:
    return InstanceView.of(iid, "x", "p", state, **load)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("instances", "target", "expected"),
    [
        ([_inst("a", in_flight=1), _inst("b", cached_blocks=900), _inst("c")], 1, ["c", "b"]),
        ([_inst("a"), _inst("b", "starting")], 1, ["b"]),
        ([_inst("a"), _inst("b", "draining"), _inst("c", "failed")], 1, []),
        ([_inst("a", queued=1), _inst("b", cached_blocks=999)], 1, ["b"]),
        ([_inst("b"), _inst("a")], 0, ["a", "b"]),
        # the instance whose sessions' KV costs least to move goes first
        ([_inst("a", session_blocks=40), _inst("b", session_blocks=10), _inst("c")], 1,
         ["c", "b"]),
        # a session block costs more than a merely cached block
        ([_inst("a", session_blocks=100), _inst("b", cached_blocks=150)], 1, ["b"]),
        # a request in flight still outweighs a few sessions' blocks
        ([_inst("a", in_flight=1), _inst("b", session_blocks=400)], 1, ["b"]),
        # a starting instance homes no session: still first
        ([_inst("a", session_blocks=1), _inst("b", "starting")], 1, ["b"]),
    ],
    ids=[
        "idle-then-cache-then-busy",
        "pending-first",
        "leaving-not-counted",
        "queued-costs-like-in-flight",
        "ties-by-id",
        "least-session-kv-first",
        "session-block-over-cached-block",
        "in-flight-over-session-kv",
        "starting-before-session-kv",
    ],
)  # fmt: skip
def test_pick_victims(instances: list[InstanceView], target: int, expected: list[str]) -> None:
    assert pick_victims(instances, "p", target) == expected


@pytest.mark.parametrize(
    ("servers", "load", "expected"),
    [(1, 0.5, 0.5), (2, 1.0, 1 / 3), (3, 2.0, 4 / 9), (2, 2.0, 1.0), (4, 0.0, 0.0)],
    ids=["mm1-is-rho", "two-servers", "three-servers", "saturated", "idle"],
)
def test_erlang_c(servers: int, load: float, expected: float) -> None:
    assert erlang_c(servers, load) == pytest.approx(expected)
