"""Smoke test of benchmarks/autoscaler_eval.py: a few virtual hours run and report."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
TRACES = Path("/work/shared/traces")


@pytest.mark.skipif(
    not (TRACES / "servegen_language_m-large_rate.csv").exists(),
    reason="needs the shared traces in /work/shared/traces (not shipped with the repo)",
)
def test_a_short_run_reports_every_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    bench = importlib.import_module("autoscaler_eval")
    out = tmp_path / "eval.json"
    assert bench.main(["--days", "0.25", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == doc
    assert set(doc["policies"]) == {"planner", "static", "kpa"}
    assert doc["policies"]["static"]["replica_hours_vs_static"] == 1.0
    assert doc["policies"]["static"]["scaling_actions"] == 0
    assert doc["policies"]["planner"]["windows"] == 5  # 300 virtual s / 60 s windows
    assert set(doc["forecast_by_predictor"]) == {"constant", "moving_average", "holt_winters"}
    co = doc["colocation"]
    assert set(co["planner_alone"]) == {"tide-a", "tide-b"}
    alone_peaks = sum(d["peak_replicas"] for d in co["planner_alone"].values())
    assert co["planner_alone_peaks"]["separate_peaks"] == alone_peaks
    for basis in ("static_peaks", "planner_alone_peaks"):
        assert co[basis]["max_replicas_used_together"] <= co[basis]["budget"]
