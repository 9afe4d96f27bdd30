"""The real-engine benchmark's pure parts: session slicing, length scaling, arguments, the
client's summary and the cached-token prediction error (no vLLM, no process)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from services.common.bench.traces import TraceRequest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _mod(name: str) -> ModuleType:
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    return importlib.import_module(name)


def _req(index: int, t: float, ids: list[int], n_in: int, n_out: int = 100) -> TraceRequest:
    return TraceRequest(index, index + 1, t, n_in, n_out, tuple(ids))


# Two sessions (first ids 1 and 9), interleaved; session 9 starts first.
TRACE = [
    _req(0, 0.0, [9, 10], 1000),
    _req(1, 1.0, [1, 2, 3], 1300),
    _req(2, 2.0, [9, 10, 11, 12], 2000),
    _req(3, 3.0, [1, 2, 3, 4], 1600),
]


@pytest.mark.parametrize(
    ("text", "want"),
    [("0:6", (0, 6)), ("4", (0, 4)), (":3", (0, 3)), ("2:5", (2, 5))],
    ids=["range", "count", "open-start", "offset"],
)
def test_parse_slice(text: str, want: tuple[int, int]) -> None:
    assert _mod("_agentic_slice").parse_slice(text) == want


@pytest.mark.parametrize(
    "text", ["3:3", "5:2", "a:b", "-1:2"], ids=["empty", "reversed", "nan", "neg"]
)
def test_parse_slice_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="slice"):
        _mod("_agentic_slice").parse_slice(text)


def test_sessions_group_by_first_block_in_arrival_order() -> None:
    groups = _mod("_agentic_slice").sessions(TRACE)
    assert [[r.index for r in g] for g in groups] == [[0, 2], [1, 3]]


@pytest.mark.parametrize(
    ("slice_", "n", "want"),
    [
        ((0, 2), 10, [(0, 0, 0), (1, 0, 1), (0, 1, 2), (1, 1, 3)]),
        ((0, 2), 3, [(0, 0, 0), (1, 0, 1), (0, 1, 2)]),
        ((1, 2), 10, [(0, 0, 1), (0, 1, 3)]),
    ],
    ids=["all", "first-n-by-arrival", "second-session-renumbered"],
)
def test_take(slice_: tuple[int, int], n: int, want: list[tuple[int, int, int]]) -> None:
    got = _mod("_agentic_slice").take(TRACE, slice_, n)
    assert [(s, t, r.index) for s, t, r in got] == want


def test_take_rejects_a_slice_past_the_sessions() -> None:
    with pytest.raises(ValueError, match="2 sessions"):
        _mod("_agentic_slice").take(TRACE, (0, 3), 10)


@pytest.mark.parametrize(
    ("max_prompt", "want"), [(400, 100), (4000, 512), (403, 100)], ids=["fit", "cap-512", "floor"]
)
def test_block_tokens_fit_the_longest_prompt(max_prompt: int, want: int) -> None:
    assert _mod("_agentic_slice").block_tokens_for(TRACE, max_prompt) == want


def test_block_tokens_refuse_a_context_too_small() -> None:
    with pytest.raises(ValueError, match="cannot hold"):
        _mod("_agentic_slice").block_tokens_for(TRACE, 3)


def test_scale_keeps_blocks_and_scales_lengths() -> None:
    m = _mod("_agentic_slice")
    picked = m.take(TRACE, (0, 2), 10)
    got = m.scale(picked, 64, 8)
    # 1000 * 64 / 512 = 125; 1300 -> 162.5 -> 163; 2000 -> 250; 1600 -> 200
    assert [s.request.input_length for s in got] == [125, 163, 250, 200]
    assert [s.request.hash_ids for s in got] == [r.hash_ids for _, _, r in picked]
    assert {s.output_tokens for s in got} == {8}
    assert all(s.request.input_length <= len(s.request.hash_ids) * 64 for s in got)


def test_scaled_turns_extend_their_session_prefix() -> None:
    """With the synthesizer, a session's next turn starts with the blocks it shares."""
    m = _mod("_agentic_slice")
    from services.common.bench.prompts import PromptSynthesizer

    got = m.scale(m.take(TRACE, (0, 2), 10), 16, 8)
    synth = PromptSynthesizer(seed=0, block_tokens=16, words=["alpha", "beta", "gamma"])
    first, second = synth.prompt(got[0].request), synth.prompt(got[2].request)
    assert second.startswith(first)  # [9, 10] is a prefix of [9, 10, 11, 12]
    assert len(second.split()) == 63  # ceil(2000 * 16 / 512)


@pytest.mark.parametrize(
    "argv",
    [["--slice", "3:3"], ["--rate", "0"], ["--routers", "nginx"], ["--max-prompt-tokens", "9000"]],
    ids=["slice", "rate", "router", "context"],
)
def test_arguments_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        _mod("real_engines").parse_args(argv)


def test_arguments_defaults() -> None:
    a = _mod("real_engines").parse_args([])
    assert (a.slice_range, a.requests, a.router_list) == ((0, 6), 60, ["tideserve", "sglang"])


def test_summary_hit_ratio_and_percentiles() -> None:
    rs = [
        {"error": None, "ttft_ms": float(t), "prompt_tokens": 100, "cached_tokens": c}
        for t, c in [(10, 0), (20, 50), (30, 100), (40, 100)]
    ]
    rs.append(
        {"error": "HTTP 500: x", "ttft_ms": None, "prompt_tokens": None, "cached_tokens": None}
    )
    got = _mod("_real_client").summarize(rs)
    assert (got["completed"], got["failed"], got["errors"]) == (4, 1, {"HTTP 500: x": 1})
    assert got["ttft_ms"] == {"mean": 25.0, "p50": 20.0, "p90": 40.0, "max": 40.0}
    assert got["hit_ratio"] == 0.625


def test_prediction_error_of_cached_tokens() -> None:
    rec = [
        SimpleNamespace(outcome=1, prompt_tokens=500, predicted_cached_tokens=p, cached_tokens=c)
        for p, c in [(256, 256), (384, 256), (0, 128)]
    ]
    rec.append(
        SimpleNamespace(outcome=5, prompt_tokens=0, predicted_cached_tokens=9, cached_tokens=0)
    )
    got = _mod("real_engines").prediction(rec)
    assert (got["records"], got["exact"], got["over_predicted"], got["under_predicted"]) == (
        3,
        1,
        1,
        1,
    )
    assert got["abs_error_over_cached"] == round(256 / 640, 4)
