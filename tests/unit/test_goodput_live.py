"""Smoke tests of benchmarks/goodput_live.py: cell parsing, the aggregation of routing_compare
documents (fakes built with routing_compare's own per-router aggregation), the resume logic,
the Markdown and the ceiling. Nothing here starts a process."""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    return importlib.import_module(name)


cells_mod = _load("_live_cells")
live = _load("goodput_live")
Cell = cells_mod.Cell
OURS, BASE = "tideserve:default", "sglang:cache_aware"


# -- cells ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("agentic:1800:300:0.5", Cell("agentic", 1800, 300, 0.5)),
        (" conversation:6000:400:2.5 ", Cell("conversation", 6000, 400, 2.5)),
        ("agentic:0:1:1", Cell("agentic", 0, 1, 1.0)),
    ],
    ids=["agentic", "conversation-spaces", "smallest"],
)
def test_parse_cell(text: str, want: Any) -> None:
    assert cells_mod.parse_cell(text) == want


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("agentic:1800:300", "KIND:OFFSET"),
        ("azure:1:2:1", "kind must be"),
        ("agentic:x:300:1", "integers"),
        ("agentic:1:300:fast", "integers"),
        ("agentic:-1:300:1", "OFFSET >= 0"),
        ("agentic:1:0:1", "REQUESTS >= 1"),
        ("agentic:1:10:0", "RATE > 0"),
    ],
    ids=["three-fields", "unknown-kind", "offset-not-int", "rate-not-number", "negative-offset",
         "no-requests", "zero-rate"],
)  # fmt: skip
def test_parse_cell_rejects(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        cells_mod.parse_cell(text)


@pytest.mark.parametrize(
    ("text", "preset", "keys"),
    [
        ("agentic:1:10:1,conversation:2:20:2.5", None, ["agentic:1:10:1", "conversation:2:20:2.5"]),
        ("agentic:1:10:1,agentic:1:10:1.0", None, ["agentic:1:10:1"]),
        ("", None, []),
    ],
    ids=["two", "duplicate", "none"],
)  # fmt: skip
def test_parse_cells(text: str, preset: str | None, keys: list[str]) -> None:
    assert [c.key for c in cells_mod.parse_cells(text, preset)] == keys


def test_preset_matrix() -> None:
    cells = cells_mod.parse_cells("agentic:287:300:0.5,agentic:1800:300:0.5", "matrix")
    assert cells[-1].key == "agentic:1800:300:0.5"  # the extra cell, the duplicate once
    assert len(cells) == 16
    agentic = [c for c in cells[:-1] if c.kind == "agentic"]
    assert {c.rate for c in agentic} == {0.5, 1.0}
    assert len(agentic) == 12
    windows = sorted({(c.offset, c.offset + c.requests) for c in agentic})
    assert len(windows) == 6
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(windows))  # disjoint
    assert windows[-1][1] <= 3448  # the agentic trace's requests
    conv = [c.key for c in cells if c.kind == "conversation"]
    assert conv == ["conversation:2000:400:2.5", "conversation:6000:400:2.5",
                    "conversation:10000:400:2.5"]  # fmt: skip


# -- aggregation ------------------------------------------------------------------------


def _run(router: str, run: int, goodput: float, ttft: float, tpot: float,
         saturated: bool = False) -> dict[str, Any]:  # fmt: skip
    return {"router": router, "run": run, "goodput_rps": goodput, "slo_attainment": 0.6,
            "ttft_ms": {"mean": ttft, "p90": 3 * ttft}, "tpot_ms": {"mean": tpot},
            "cache_hit_ratio": 0.86, "completed": 300, "failed": 0,
            "cpu": {"saturated": saturated}}  # fmt: skip


def _doc(results: list[dict[str, Any]]) -> dict[str, Any]:
    """A routing_compare document of ``results``, aggregated as routing_compare does."""
    rules = _load("_compare_rules")
    return {"results": results, "per_router": rules.per_router(results),
            "fleet": {"profile": "h200-llama3.1-8b*1.2", "stream_interval": 16},
            "workload": {"slo_ttft_ms": 2000.0}, "log_dir": "/tmp/x",
            "machine": {"git_commit": "abc1234", "loadavg_1m_before": 0.2}}  # fmt: skip


CEILING = {"infeasible_share": 0.3, "max_attainment": 0.7}


def _report(cell: str, results: list[dict[str, Any]], rules: str = "new") -> dict[str, Any]:
    c = cells_mod.parse_cell(cell)
    return cells_mod.cell_report(c, rules, _doc(results), CEILING, [OURS, BASE], 2)  # type: ignore[no-any-return]


TWO_EACH = [_run(OURS, 0, 1.2, 4000, 30), _run(BASE, 0, 1.0, 6000, 40),
            _run(OURS, 1, 1.0, 5000, 40, saturated=True), _run(BASE, 1, 1.0, 6000, 40)]  # fmt: skip


def test_cell_report_means_ranges_ratios() -> None:
    rep = _report("agentic:1800:300:0.5", TWO_EACH)
    ours = rep["routers"][OURS]
    assert ours["runs"] == 2 and ours["cpu_saturated_runs"] == 1 and ours["any_cpu_saturated"]
    assert ours["metrics"]["goodput_rps"] == {"mean": 1.1, "min": 1.0, "max": 1.2}
    assert ours["metrics"]["ttft_p90_ms"]["mean"] == 13500
    assert rep["complete"] and rep["any_cpu_saturated"] and rep["ceiling"] == CEILING
    vs = rep["vs_cache_aware"][OURS]
    assert (vs["goodput"], vs["ttft_mean"], vs["tpot_mean"]) == (1.1, 0.75, 0.875)
    assert vs["goodput_met"] and vs["ttft_mean_met"] and vs["tpot_mean_met"]
    assert BASE not in rep["vs_cache_aware"]


@pytest.mark.parametrize(
    ("cell", "results", "complete", "keys"),
    [
        ("agentic:1:300:1", TWO_EACH[:3], False, {"goodput_met", "ttft_mean_met"}),
        ("agentic:1:300:1", [*TWO_EACH[:3], {"router": BASE, "run": 1, "error": "x"}], False,
         {"goodput_met"}),
        ("conversation:1:400:2.5", TWO_EACH, True, {"ttft_mean_met", "tpot_mean_met"}),
    ],
    ids=["run-missing", "run-failed", "conversation-no-goodput-target"],
)  # fmt: skip
def test_cell_report_completeness_and_targets(
    cell: str, results: list[dict[str, Any]], complete: bool, keys: set[str]
) -> None:
    rep = _report(cell, results)
    assert rep["complete"] is complete
    assert keys <= set(rep["vs_cache_aware"][OURS])
    if cell.startswith("conversation"):
        assert "goodput_met" not in rep["vs_cache_aware"][OURS]


def test_goodput_against_a_baseline_of_zero() -> None:
    zero = [_run(OURS, 0, 0.2, 9000, 50), _run(BASE, 0, 0.0, 9000, 50),
            _run(OURS, 1, 0.1, 9000, 50), _run(BASE, 1, 0.0, 9000, 50)]  # fmt: skip
    rep = _report("agentic:1:300:1", zero)
    vs = rep["vs_cache_aware"][OURS]
    assert vs["goodput"] is None and vs["goodput_baseline_zero"] and vs["goodput_met"]
    text = cells_mod.markdown([rep], cells_mod.summary([rep], []))
    assert "| **- (baseline 0)** | ≥ 1.0" in text
    g = cells_mod.summary([rep], [])["new"]["vs_cache_aware"][OURS]["goodput"]
    assert (g["per_cell"], g["cells_met"], g["agentic_ratio_of_means"]) == (None, 1, None)


def test_cell_report_without_a_document() -> None:
    rep = cells_mod.cell_report(Cell("agentic", 1, 10, 1.0), "new", {"error": "x"}, {},
                                [OURS, BASE], 2)  # fmt: skip
    assert not rep["complete"] and rep["routers"] == {} and rep["vs_cache_aware"] == {}


def test_summary_over_cells() -> None:
    worse = [_run(OURS, r, 0.5, 9000, 50) for r in (0, 1)] + [
        _run(BASE, r, 1.0, 6000, 40) for r in (0, 1)
    ]
    reports = [_report("agentic:1:300:0.5", TWO_EACH), _report("agentic:2:300:1", worse),
               _report("conversation:3:400:2.5", TWO_EACH),
               _report("agentic:4:300:1", TWO_EACH[:1])]  # fmt: skip
    wanted = [(r["cell"], "new") for r in reports] + [("agentic:9:300:1", "new")]
    s = cells_mod.summary(reports, wanted)
    new = s["new"]
    assert new["cells_complete"] == 3 and new["cells_incomplete"] == ["agentic:4:300:1"]
    assert new["cells_cpu_saturated"] == ["agentic:1:300:0.5", "conversation:3:400:2.5"]
    g = new["vs_cache_aware"][OURS]["goodput"]
    assert g["per_cell"] == {"mean": 0.8, "min": 0.5, "max": 1.1, "cells": 2}
    assert (g["cells_met"], g["cells"], g["agentic_mean_met"]) == (1, 2, False)
    assert g["agentic_ratio_of_means"] == 0.8  # (1.1 + 0.5) / 2 over (1.0 + 1.0) / 2
    assert new["vs_cache_aware"][OURS]["ttft_mean"]["cells"] == 3
    assert s["missing"] == ["agentic:4:300:1 (new)", "agentic:9:300:1 (new)"]


# -- Markdown ---------------------------------------------------------------------------


def test_markdown_table_in_the_readme_shape() -> None:
    rep = _report("agentic:1800:300:0.5", TWO_EACH)
    text = cells_mod.markdown([rep], cells_mod.summary([rep], [(rep["cell"], "new")]))
    text = text.replace(cells_mod.TIMES, "x")
    lines = text.splitlines()
    assert lines[0].startswith("**agentic 1800** (300 requests) @0.5x, rules of record")
    assert "max attainment 0.7" in lines[0] and "CPU-saturated: tideserve:default" in lines[0]
    assert "commit abc1234, load average before 0.2" in lines[0]
    assert (
        "| figure | Tideserve `default` | sglang-router `cache_aware` | ratio | target |" in lines
    )
    assert (
        "| goodput | 1.100 req/s (1.000-1.200) | 1.000 req/s (1.000-1.000) | **1.10x** | ≥ 1.0x |"
        in lines
    )
    assert "| TTFT mean | 4.50 s (4.00-5.00) | 6.00 s (6.00-6.00) | **0.75x** | ≤ 0.8x |" in lines
    assert "| cache hit | 0.860 (0.860-0.860) | 0.860 (0.860-0.860) |  |  |" in lines
    assert "Rules of record, Tideserve `default` vs `cache_aware` over 1 cells" in text
    assert "Not run yet" not in text


def test_markdown_unmet_ratio_not_bold_and_missing_cells() -> None:
    worse = [_run(OURS, r, 0.5, 9000, 50) for r in (0, 1)] + [
        _run(BASE, r, 1.0, 6000, 40) for r in (0, 1)
    ]
    rep = _report("agentic:2:300:1", worse, rules="old")
    text = cells_mod.markdown([rep], cells_mod.summary([rep], [("agentic:5:300:1", "old")]))
    text = text.replace(cells_mod.TIMES, "x")
    assert "old rules" in text.splitlines()[0]
    assert "| 0.50x | ≥ 1.0x |" in text and "**0.50x**" not in text
    assert "Not run yet: agentic:5:300:1 (old)." in text


# -- slices, commands, resume -----------------------------------------------------------


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    """A command line over a 50-line fake trace and a state file under ``tmp_path``."""
    trace = tmp_path / "trace.jsonl"
    if not trace.exists():
        trace.write_text("".join(f'{{"i": {i}}}\n' for i in range(50)), encoding="utf-8")
    return ["--agentic-trace", str(trace), "--conv-trace", str(trace),
            "--state", str(tmp_path / "state.json"), *extra]  # fmt: skip


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    return live.parse_args(_argv(tmp_path, *extra))  # type: ignore[no-any-return]


def test_write_slice_cuts_lines_like_sed(tmp_path: Path) -> None:
    args = _args(tmp_path)
    dest = live.write_slice(Path(args.agentic_trace), Cell("agentic", 10, 5, 1.0),
                            tmp_path / "s.jsonl")  # fmt: skip
    assert [json.loads(x)["i"] for x in dest.read_text().splitlines()] == [10, 11, 12, 13, 14]
    with pytest.raises(ValueError, match="only 50 lines"):
        live.write_slice(Path(args.agentic_trace), Cell("agentic", 45, 10, 1.0), dest)


@pytest.mark.parametrize(
    ("extra", "present", "absent"),
    [
        ([], ["--rate-scale 0.5", "--max-requests 5", "--runs 2", "--speedup 1",
              "--routers tideserve:default,sglang:cache_aware"], ["--old-rules", "--log-dir"]),
        (["--old-rules", "--runs", "3"], ["--old-rules", "--runs 3"], []),
    ],
    ids=["record", "old-rules"],
)  # fmt: skip
def test_compare_argv(
    tmp_path: Path, extra: list[str], present: list[str], absent: list[str]
) -> None:
    cmd = " ".join(live.compare_argv(Cell("agentic", 10, 5, 0.5), _args(tmp_path, *extra),
                                     Path("slice"), Path("out.json"), None))  # fmt: skip
    assert "routing_compare.py --trace slice" in cmd
    assert all(p in cmd for p in present) and not any(a in cmd for a in absent)


def test_compare_argv_one_router_one_run(tmp_path: Path) -> None:
    cmd = live.compare_argv(Cell("agentic", 10, 5, 0.5), _args(tmp_path), Path("slice"),
                            Path("out.json"), None, one=BASE)  # fmt: skip
    at = cmd.index("--routers")
    assert cmd[at + 1] == BASE and cmd[cmd.index("--runs") + 1] == "1"


def test_parallel_runs_merge_like_one_comparison() -> None:
    """Four one-run documents merge into what one routing_compare of two runs per router
    reports: the same per-router means and ranges, the runs numbered per router."""
    one_each = [_doc([{**r, "run": 0}]) for r in TWO_EACH]
    merged = live.merge_runs(one_each)
    assert [(r["router"], r["run"]) for r in merged["results"]] == [
        (OURS, 0), (BASE, 0), (OURS, 1), (BASE, 1)]  # fmt: skip
    assert merged["per_router"] == _doc(TWO_EACH)["per_router"]
    assert merged["runs"] == 2 and merged["parallel_runs"] == 4
    c = cells_mod.parse_cell("agentic:1800:300:0.5")
    rep = cells_mod.cell_report(c, "new", merged, CEILING, [OURS, BASE], 2)
    assert rep == _report("agentic:1800:300:0.5", TWO_EACH)


class FakeRunner:
    """Stands in for ``run_cell``: a complete entry (or not) per cell, calls recorded."""

    def __init__(self, incomplete: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.calls: list[str] = []
        self.incomplete = incomplete

    def __call__(self, cell: Any, args: argparse.Namespace) -> dict[str, Any]:
        self.calls.append(cell.key)
        runs = TWO_EACH[:2] if cell.key in self.incomplete else TWO_EACH
        return {"cell": cell.key, "rules": live.rules_of(args),
                "complete": cell.key not in self.incomplete, "ceiling": CEILING,
                "compare": _doc(runs)}  # fmt: skip


def test_resume_runs_only_cells_not_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cells = "agentic:0:10:0.5,agentic:10:10:1,conversation:20:10:2.5"
    first = FakeRunner(incomplete={"agentic:10:10:1"})
    monkeypatch.setattr(live, "run_cell", first)
    assert live.main(_argv(tmp_path, "--cells", cells)) == 1  # one incomplete
    assert first.calls == ["agentic:0:10:0.5", "agentic:10:10:1", "conversation:20:10:2.5"]
    state = json.loads((tmp_path / "state.json").read_text())
    assert sorted(state["cells"]) == [f"{k}|new" for k in sorted(cells.split(","))]
    again = FakeRunner()
    monkeypatch.setattr(live, "run_cell", again)
    capsys.readouterr()
    assert live.main(_argv(tmp_path, "--cells", cells)) == 0
    assert again.calls == ["agentic:10:10:1"]  # the incomplete cell, run again
    out = json.loads(capsys.readouterr().out)
    assert [c["cell"] for c in out["cells"]] == cells.split(",")
    old = FakeRunner()
    monkeypatch.setattr(live, "run_cell", old)
    assert live.main(_argv(tmp_path, "--cells", cells, "--old-rules")) == 0
    assert len(old.calls) == 3  # the old rules beside the new, in the same state
    out = json.loads(capsys.readouterr().out)
    assert [(c["cell"], c["rules"]) for c in out["cells"]][:2] == [
        ("agentic:0:10:0.5", "new"), ("agentic:0:10:0.5", "old")]  # fmt: skip
    assert set(out["summary"]) == {"new", "old", "missing"}


@pytest.mark.parametrize(
    ("extra", "code", "calls"),
    [
        (["--report"], 1, 0),
        (["--plan"], 0, 0),
        (["--runs", "3"], 2, 0),  # the state holds cells of --runs 2
        (["--cells", "agentic:45:10:1"], 2, 0),  # past the trace's end
    ],
    ids=["report-only", "plan", "other-settings", "past-the-trace"],
)  # fmt: skip
def test_main_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str], code: int, calls: int
) -> None:
    live.save_state(str(tmp_path / "state.json"),
                    live.load_state(None, live.settings_of(_args(tmp_path))))  # fmt: skip
    fake = FakeRunner()
    monkeypatch.setattr(live, "run_cell", fake)
    base = [] if "--cells" in extra else ["--cells", "agentic:0:10:1"]
    assert live.main(_argv(tmp_path, *base, *extra)) == code
    assert len(fake.calls) == calls


# -- ceiling ----------------------------------------------------------------------------


def test_ceiling_counts_what_no_router_could_serve() -> None:
    ceil = _load("_goodput_ceiling")
    from services.common.perfmodel import get_profile

    perf = get_profile("h200-llama3.1-8b")
    n = 64 * 1000  # long enough that its uncached prefill misses a 2 s TTFT
    prefix = list(range(1000))
    own = perf.prefill_ms(n, 0)
    assert own > 2000.0 > perf.prefill_ms(64, n - 64) + 15 * perf.decode_step_ms(1, 0)
    reqs = [
        ceil.CeilingRequest(0.0, n, prefix),  # first carrier: hopeless
        ceil.CeilingRequest(own - 1.0, n, [*prefix[:-1], 999]),  # its prefix not ready yet
        ceil.CeilingRequest(own + 1.0, n, [*prefix[:-1], 998]),  # its prefix ready: cached
        ceil.CeilingRequest(own + 2.0, 64, [5000]),  # short: fine
    ]
    got = ceil.ceiling_of(reqs, engine_profile="h200-llama3.1-8b", stream_interval=16,
                          block_size=64, slo_ttft_ms=2000.0)  # fmt: skip
    assert got == {"infeasible_share": 0.5, "max_attainment": 0.5}


@pytest.mark.parametrize("rate", [1.0, 0.25], ids=["1x", "0.25x"])
def test_ceiling_from_the_slice_equals_the_simulators(rate: float) -> None:
    """The slice's requests tokenized as the bench sends them give goodput_sim's ceiling."""
    from services.common.bench.traces import Trace, parse_mooncake
    from services.sim import SimConfig, simulate

    ceil = _load("_goodput_ceiling")
    lines = [json.dumps({"timestamp": i * 40, "input_length": 1100, "output_length": 8,
                         "hash_ids": [i // 3, 100 + i, 200 + i]}) for i in range(8)]  # fmt: skip
    trace = Trace("mem.jsonl", "mooncake", tuple(parse_mooncake(lines)))
    cfg = SimConfig(engines=2, max_requests=6, offset=2, kv_blocks=2048, rate_scale=rate,
                    slo_ttft_ms=100.0, keep_block_hashes=True)  # fmt: skip
    _, run = simulate(cfg, trace)
    sim = _load("goodput_sim").ceiling(run, cfg)
    reqs = ceil.slice_requests(trace, 2, 6, rate, cfg.block_size)
    got = ceil.ceiling_of(reqs, engine_profile=cfg.engine_profile,
                          stream_interval=cfg.stream_interval, block_size=cfg.block_size,
                          slo_ttft_ms=100.0)  # fmt: skip
    assert got == sim and 0.0 < sim["infeasible_share"] < 1.0
