"""``tideserve recommend``'s planner step (services/sim/planner_search.py): which planner
settings it keeps, what it refuses, and its rows."""

from __future__ import annotations

from typing import Any

import pytest

from services.sim.config import SimConfigError
from services.sim.planner_search import PlannerOutcome, parse_axes, planner_rows, tune
from services.sim.search import Family, Outcome

CAND = Family("aggregated", "default").at(4)


def _fake(results: dict[tuple[tuple[str, Any], ...], tuple[bool, float]], calls: list[Any]) -> Any:
    """A run with a scripted (passes, replica-s) per settings; unscripted: passes at 400."""

    def run(settings: tuple[tuple[str, Any], ...]) -> PlannerOutcome:
        calls.append(settings)
        ok, rs = results.get(settings, (True, 400.0))
        out = Outcome(CAND, 900.0, 20.0, 0.95, 0, ok, "" if ok else "TTFT")
        return PlannerOutcome(settings, out, rs, 4)

    return run


U7 = (("max_utilization", 0.7),)
U95 = (("max_utilization", 0.95),)
RE = (("policy", "reactive"),)


@pytest.mark.parametrize(
    ("axes", "results", "want", "runs"),
    [
        ([], {}, (), 1),
        # a value is kept only where it saves replica-seconds
        ([("max_utilization", [0.7, 0.95])], {U95: (True, 300.0)}, U95, 3),
        # cheaper but missing the SLOs: not kept
        ([("max_utilization", [0.95])], {U95: (False, 100.0)}, (), 2),
        # the autoscaler's own misses: a passing value wins even when dearer
        ([("policy", ["reactive"])], {(): (False, 300.0), RE: (True, 500.0)}, RE, 2),
        # settings combine over the best so far
        (
            [("policy", ["reactive"]), ("max_utilization", [0.95])],
            {RE: (True, 350.0), (("max_utilization", 0.95), ("policy", "reactive")): (True, 320.0)},
            (("max_utilization", 0.95), ("policy", "reactive")),
            3,
        ),
        # the autoscaler's own value, stated: the same cost, not kept
        ([("max_utilization", [0.85])], {(("max_utilization", 0.85),): (True, 400.0)}, (), 2),
    ],
    ids=["nothing-to-try", "cheaper-kept", "cheaper-but-missing", "passing-beats-missing",
         "combined", "same-cost-not-kept"],
)  # fmt: skip
def test_tune_keeps_a_setting_only_where_it_pays(
    axes: list[tuple[str, list[Any]]],
    results: dict[tuple[tuple[str, Any], ...], tuple[bool, float]],
    want: tuple[tuple[str, Any], ...],
    runs: int,
) -> None:
    calls: list[Any] = []
    run = _fake({(): (True, 400.0), **results}, calls)
    best, seen = tune(axes, run)
    assert best.settings == want and len(calls) == runs and len(seen) == runs


@pytest.mark.parametrize(
    ("texts", "want"),
    [
        ({"policy": "reactive", "predictor": ""}, [("policy", ["reactive"])]),
        ({"max_utilization": "0.7, 0.95"}, [("max_utilization", [0.7, 0.95])]),
        ({"decode_headroom": ""}, []),
    ],
    ids=["strings", "numbers", "empty"],
)
def test_parse_axes(texts: dict[str, str], want: list[tuple[str, list[Any]]]) -> None:
    assert parse_axes(texts) == want


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        ({"policy": "psychic"}, "--try-policy: 'psychic'"),
        ({"predictor": "tea_leaves"}, "--try-predictor"),
        ({"max_utilization": "1.5"}, "--try-max-utilization"),
        ({"decode_headroom": "lots"}, "--try-decode-headroom"),
    ],
    ids=["policy", "predictor", "utilization-range", "not-a-number"],
)
def test_bad_planner_values_are_refused(texts: dict[str, str], message: str) -> None:
    with pytest.raises(SimConfigError, match=message):
        parse_axes(texts)


def test_planner_rows_say_why_each_lost() -> None:
    calls: list[Any] = []
    run = _fake({(): (True, 400.0), U7: (True, 400.0), U95: (False, 100.0), RE: (True, 500.0)},
                calls)  # fmt: skip
    best, seen = tune([("max_utilization", [0.7, 0.95]), ("policy", ["reactive"])], run)
    rows = planner_rows(best, seen, 800.0, 90)
    why = {str(r["planner"]): r["why_not"] for r in rows}
    assert why == {
        "the autoscaler's": "",
        "{'max_utilization': 0.7}": "passes, but saves nothing over the chosen settings",
        "{'policy': 'reactive'}": "passes, but 500 replica-s > 400",
        "{'max_utilization': 0.95}": "misses: TTFT",
    }
    assert rows[0]["replica_s_vs_fixed"] == 0.5 and rows[-1]["passes"] is False
