"""Smoke tests of the performance-model benchmarks' arithmetic and arguments (no process,
no timing): routing_compare's closed-loop ratios and prediction error, perfmodel_fit's
arguments and spread."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest
from tideserve.v1 import events_pb2

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    return importlib.import_module(name)


@pytest.mark.parametrize(
    ("fit_mean", "met"), [(1050.0, True), (1150.0, False)], ids=["within-10pct", "outside"]
)
def test_closed_loop_targets(fit_mean: float, met: bool) -> None:
    results = [
        {"router": "true-profile", "ttft_ms": {"mean": 1000.0}},
        {"router": "wrong-profile", "ttft_ms": {"mean": 1400.0}},
        {"router": "wrong-profile+fit", "ttft_ms": {"mean": fit_mean}},
    ]
    out = _load("routing_compare").closed_loop_targets(results)
    assert out["wrong_vs_true"] == 1.4
    assert out["fit_vs_true"] == round(fit_mean / 1000.0, 3)
    assert out["met"] is met


def test_prediction_error_over_the_run_and_its_second_half() -> None:
    recs = [
        events_pb2.RequestRecord(arrival_ms=i, ttft_ms=100.0, predicted_ttft_ms=p)
        for i, p in enumerate([200.0, 200.0, 110.0, 90.0])
    ]
    recs.append(events_pb2.RequestRecord(arrival_ms=9, ttft_ms=0.0, predicted_ttft_ms=5.0))
    out = _load("routing_compare").prediction_error(recs)
    assert out == {"records": 4, "all": 1.0, "second_half": 0.1}


def test_perfmodel_fit_arguments_and_spread() -> None:
    pf = _load("perfmodel_fit")
    args = pf.parse_args(["--slices", "0:10:1.5", "--engines", "2"])
    assert (args.slices, args.engines, args.prior) == ("0:10:1.5", 2, "h200-llama3.1-8b*2")
    assert pf._spread([0.1, 0.3]) == {"mean": 0.2, "stdev": 0.1, "min": 0.1, "max": 0.3}
    assert pf._median_err([110.0, 50.0, 100.0], [100.0, 100.0, 100.0]) == pytest.approx(0.1)
