"""benchmarks/pd_closed_loop.py: when a loop has settled (table), and a short run's report."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def bench() -> ModuleType:
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    return importlib.import_module("pd_closed_loop")


def minutes(*splits: tuple[int, int]) -> list[dict[str, float]]:
    return [{"replicas_prefill": float(p), "replicas_decode": float(d)} for p, d in splits]


@pytest.mark.parametrize(
    ("splits", "settled", "minute", "stable"),
    [
        ([(2, 6), (8, 6), (6, 5), (4, 4), (4, 4), (4, 4)], (4, 4), 3, True),
        ([(4, 4)] * 6, (4, 4), 0, True),
        ([(2, 6), (5, 4), (4, 4), (5, 4), (4, 5), (4, 4)], (4, 4), 1, True),  # within one
        ([(4, 4), (4, 4), (9, 4), (4, 4), (4, 4), (4, 4)], (4, 4), 3, True),  # a late excursion
        ([(p, 6) for p in range(1, 10)], (8, 6), 6, False),  # still moving at the end
    ],
    ids=["overshoot-then-settle", "never-moved", "jitter-within-one", "late-excursion", "still-moving"],
)  # fmt: skip
def test_the_loop_settles_where_it_stays(
    splits: list[tuple[int, int]], settled: tuple[int, int], minute: int, stable: bool
) -> None:
    s = bench().settle(minutes(*splits))
    assert s["stable"] is stable
    assert (s["settled"]["prefill"], s["settled"]["decode"]) == settled
    assert s["converged_minute"] == minute


def test_the_best_split_is_the_highest_goodput_then_attainment() -> None:
    rows: list[dict[str, Any]] = [
        {"prefill": 1, "goodput_rps": 0.5, "slo_attainment": 0.9, "ttft_p90_ms": 100.0},
        {"prefill": 2, "goodput_rps": 0.8, "slo_attainment": 0.7, "ttft_p90_ms": 900.0},
        {"prefill": 3, "goodput_rps": 0.8, "slo_attainment": 0.8, "ttft_p90_ms": 950.0},
        {"prefill": 4, "goodput_rps": None, "slo_attainment": None, "ttft_p90_ms": None},
    ]
    assert bench().best_split(rows)["prefill"] == 3


def test_a_short_run_sweeps_loops_and_compares(tmp_path: Path) -> None:
    lengths = tmp_path / "l.jsonl"
    lengths.write_text("\n".join(
        json.dumps({"timestamp": i * 500, "input_length": 900 + 30 * (i % 4), "output_length": 12,
                    "hash_ids": [i // 3, 100 + i]})
        for i in range(40)
    ) + "\n")  # fmt: skip
    out = tmp_path / "o.json"
    argv = ["--lengths", str(lengths), "--rate", "1", "--duration-s", "240", "--instances", "3",
            "--start", "1,2", "--max-replicas", "3", "--startup-s", "20", "--out", str(out)]  # fmt: skip
    assert bench().main(argv) == 0
    doc = json.loads(out.read_text())
    assert [(r["prefill"], r["decode"]) for r in doc["sweep"]["splits"]] == [(1, 2), (2, 1)]
    assert doc["sweep"]["best"] in doc["sweep"]["splits"]
    loop = doc["loop"]
    assert loop["start"] == {"prefill": 1, "decode": 2} and loop["failed"] == 0
    assert loop["timeline"] and 0 <= loop["converged_s"] <= 60 * len(loop["timeline"])
    assert doc["workload"]["requests"] > 100  # 240 s at 1 req/s, Poisson
