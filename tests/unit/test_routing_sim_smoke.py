"""benchmarks/routing_sim.py on a tiny synthetic Mooncake trace: every request completes,
the JSON has the documented keys, the same inputs give the same figures (no timing)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def routing_sim() -> ModuleType:
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    return importlib.import_module("routing_sim")


def write_trace(path: Path, n: int) -> Path:
    """Conversations of 2 turns sharing their first 512-token block, 2-3 blocks long."""
    lines = []
    for i in range(n):
        conv = i // 2
        hashes = [conv * 10, conv * 10 + 1 + (i % 2), conv * 10 + 5]
        lines.append(
            json.dumps(
                {
                    "timestamp": i * 200,
                    "input_length": 1200 + 100 * (i % 3),
                    "output_length": 20 + i % 5,
                    "hash_ids": hashes,
                }
            )
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run(tmp_path: Path, argv: list[str]) -> dict[str, Any]:
    trace = write_trace(tmp_path / "trace.jsonl", 24)
    out = tmp_path / "out.json"
    assert routing_sim().main(["--trace", str(trace), "--out", str(out), *argv]) == 0
    return dict(json.loads(out.read_text(encoding="utf-8")))


@pytest.mark.parametrize(
    ("argv", "engines", "disaggregates"),
    [
        (["--engines", "2", "--profiles", "default,round_robin"], 2, False),
        (["--engines", "2", "--profiles", "cache_aware", "--load-source", "stream"], 2, False),
        (["--pd", "--prefill", "1", "--decode", "2", "--profiles", "default"], 3, True),
        (["--engines", "2", "--profiles", "default,slo", "--precise"], 2, False),
    ],
    ids=["aggregated", "stream-load", "pd", "precise-data"],
)
def test_routing_sim_runs(
    tmp_path: Path, argv: list[str], engines: int, disaggregates: bool
) -> None:
    doc = run(tmp_path, [*argv, "--rate-scale", "1"])
    assert doc["infinite_cache_hit_ratio"] > 0
    for r in doc["results"]:
        assert r["completed"] == 24
        assert len(r["requests_per_engine"]) == engines
        assert sum(r["requests_per_engine"]) == 24
        assert 0.0 <= r["cache_hit_ratio"] <= 1.0
        assert 0.0 <= r["slo_attainment"] <= 1.0
        assert r["ttft_ms"]["mean"] > 0 and r["tpot_ms"]["mean"] > 0
        assert r["routing"]["picks"] == 24
        assert (r["routing"]["disaggregated"] > 0) == disaggregates
        # where the mean TTFT goes: the three parts add up to it
        split = r["time_split_ms"]
        parts = split["own_prefill"] + split["wait"] + split["first_chunk"]
        assert parts == pytest.approx(r["ttft_ms"]["mean"], abs=0.3)
        assert split["own_prefill"] > 0 and split["first_chunk"] >= 0
        assert 0.0 < split["busy_share"] <= 1.0 and 0.0 <= split["mixed_step_share"] <= 1.0
    # Deterministic: the same inputs give the same JSON results.
    again = run(tmp_path, [*argv, "--rate-scale", "1"])
    strip = [{k: v for k, v in r.items() if k != "sim_cpu_s"} for r in doc["results"]]
    assert strip == [{k: v for k, v in r.items() if k != "sim_cpu_s"} for r in again["results"]]


def test_routing_sim_reuses_routed_prefixes(tmp_path: Path) -> None:
    """Second turns share the first block: a prefix-aware profile gets engine cache hits."""
    doc = run(tmp_path, ["--engines", "2", "--profiles", "default", "--rate-scale", "1"])
    (r,) = doc["results"]
    assert r["cache_hit_ratio"] > 0
    assert r["routing"]["engine_cached_tokens"] == r["routing"]["predicted_cached_tokens"]


@pytest.mark.parametrize(("precise", "expect_cached"), [(True, True), (False, False)],
                         ids=["with-precise", "without"])  # fmt: skip
def test_routing_sim_precise_data_reaches_the_cycle(
    tmp_path: Path, precise: bool, expect_cached: bool
) -> None:
    """The precise-only profile (no approximate index) predicts cached tokens only when
    --precise gives the cycle the engines' resident prefixes."""
    profiles = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles_precise_only.yaml"
    argv = ["--engines", "2", "--profiles", "precise", "--profiles-file", str(profiles),
            "--rate-scale", "1", *(["--precise"] if precise else [])]  # fmt: skip
    (r,) = run(tmp_path, argv)["results"]
    assert (r["routing"]["predicted_cached_tokens"] > 0) == expect_cached


def step_trace_summary() -> ModuleType:
    routing_sim()  # puts benchmarks/ on sys.path
    return importlib.import_module("step_trace_summary")


@pytest.mark.parametrize("profile", ["default", "round_robin"], ids=["default", "round-robin"])
def test_step_traces_agree_with_the_simulators_figures(tmp_path: Path, profile: str) -> None:
    """The engines' step traces (the live engines' --step-trace format), summarised by
    benchmarks/step_trace_summary.py, give back what the simulator counted itself."""
    traces = tmp_path / "steps"
    argv = ["--engines", "2", "--profiles", profile, "--rate-scale", "1",
            "--step-traces", str(traces)]  # fmt: skip
    (r,) = run(tmp_path, argv)["results"]
    files = sorted(str(f) for f in traces.glob("*.steps.jsonl"))
    out = tmp_path / "summary.json"
    assert step_trace_summary().main([*files, "--out", str(out)]) == 0
    fleet = json.loads(out.read_text(encoding="utf-8"))[profile]["fleet"]
    assert fleet["requests_per_engine"] == r["requests_per_engine"]
    routing = r["routing"]
    assert fleet["prefill_tokens"] == routing["prompt_tokens"] - routing["engine_cached_tokens"]
    assert fleet["late_share"] == 0.0  # virtual time: no shell overhead
    # The engine times from its first token, the bench from the first 16-token chunk, both
    # over (tokens - 1): per request the engine's figure is never the smaller.
    assert fleet["engine_tpot_ms"] >= r["tpot_ms"]["mean"] > 0


def test_placement_replay_gives_back_the_simulators_figures(tmp_path: Path) -> None:
    """Replaying the simulator's own placement (from its step traces) on fresh engine cores
    reproduces its TTFT and TPOT: the replay adds nothing of its own."""
    lines = [
        json.dumps({"timestamp": i * 150, "input_length": 1200 + 7 * i,
                    "output_length": 20 + i % 5, "hash_ids": [i // 2 * 10, i // 2 * 10 + 1, 100 + i]})
        for i in range(24)
    ]  # fmt: skip
    trace = tmp_path / "unique.jsonl"
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    traces, out = tmp_path / "steps", tmp_path / "sim.json"
    argv = ["--trace", str(trace), "--out", str(out), "--engines", "2", "--rate-scale", "1",
            "--profiles", "round_robin", "--step-traces", str(traces)]  # fmt: skip
    assert routing_sim().main(argv) == 0
    (sim,) = json.loads(out.read_text(encoding="utf-8"))["results"]
    replay = importlib.import_module("placement_replay")
    files = sorted(str(f) for f in traces.glob("*.steps.jsonl"))
    rout = tmp_path / "replay.json"
    argv = [*files, "--trace", str(trace), "--max-requests", "24", "--engines", "2",
            "--out", str(rout)]  # fmt: skip
    assert replay.main(argv) == 0
    got = json.loads(rout.read_text(encoding="utf-8"))["results"]["round_robin"]
    assert got["matched"] == 24
    assert got["requests_per_engine"] == sim["requests_per_engine"]
    assert got["ttft_ms"] == sim["ttft_ms"] and got["tpot_ms"] == sim["tpot_ms"]


@pytest.mark.parametrize(
    ("submits", "lengths", "expect"),
    [
        # each engine's clock has its own offset (100, 500 ms); its fastest request waited 0
        # and the others keep their delay (request 1: 150 ms)
        ({0: [(100.0, 10), (350.0, 11)], 1: [(700.0, 12)]}, [10, 11, 12],
         [(0, 0, 0.0), (2, 1, 200.0), (1, 0, 250.0)]),
        # a shared length goes to the latest request of it that had arrived by then
        ({0: [(0.0, 10), (150.0, 5), (260.0, 5)]}, [10, 5, 5],
         [(0, 0, 0.0), (1, 0, 150.0), (2, 0, 260.0)]),
        # an engine with no request of a unique length cannot be placed on the clock
        ({0: [(0.0, 10)], 1: [(900.0, 5)]}, [10, 5, 5], [(0, 0, 0.0)]),
    ],
    ids=["clock-offsets", "shared-length", "no-anchor"],
)  # fmt: skip
def test_placement_replay_matches_submits_to_trace_requests(
    submits: dict[int, list[tuple[float, int]]],
    lengths: list[int],
    expect: list[tuple[int, int, float]],
) -> None:
    routing_sim()
    replay = importlib.import_module("placement_replay")
    arrivals = [0.0, 100.0, 200.0][: len(lengths)]
    got = replay.place(submits, arrivals, lengths)
    assert [(p.k, p.engine, p.at_ms) for p in got] == expect
