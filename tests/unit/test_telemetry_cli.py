"""``tideserve get windows|session`` and ``tideserve top``: arguments and rendering (pure)."""

from __future__ import annotations

import argparse

import pytest
from tideserve.v1 import telemetry_pb2

from services.cli import build_parser
from services.telemetry.cli import parse_duration, render_session, render_top, render_windows
from tests.helpers.records import record

DURATIONS = [
    ("90", 90.0),
    ("90s", 90.0),
    ("5m", 300.0),
    ("1.5h", 5400.0),
    ("2d", 172800.0),
    ("500ms", 0.5),
]


@pytest.mark.parametrize(("text", "seconds"), DURATIONS, ids=[d[0] for d in DURATIONS])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "0", "-5m", "5 weeks", "m"], ids=["empty", "zero", "negative", "unit", "no-number"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_verbs_are_registered() -> None:
    parser = build_parser()
    args = parser.parse_args(["get", "windows", "--deployment", "d", "--last", "5m", "--json"])
    assert (args.deployment, args.last, args.json) == ("d", 300.0, True)
    assert parser.parse_args(["get", "session", "abc"]).session_id == "abc"
    assert parser.parse_args(["top", "--once"]).once


def test_render_session_shows_turn_figures_engine_reason_and_tools() -> None:
    turn = record("t1", session_id="s", prompt_tokens=1000, cached_tokens=600, profile="agent")
    turn.decode_instance = "engine-3"
    turn.scores.add(plugin="prefix", score=0.9, weight=2.0)
    turn.scores.add(plugin="load", score=0.5, weight=1.0)
    turn.scores.add(plugin="tiny", score=0.1, weight=1.0)
    turn.tool_calls.add(name="search", argument_bytes=10)
    turn.tool_results.add(tool_call_id="c0", name="fetch", content_bytes=99)
    out = render_session("s", [turn])
    row = out.splitlines()[2]
    for part in (
        "t1",
        "120",
        "20.0",
        "600",
        "400",
        "engine-3",
        "agent prefix=0.90 load=0.50",
        "call search",
        "result fetch",
    ):
        assert part in row, part
    assert "tiny" not in row


def test_render_windows_and_top() -> None:
    s = telemetry_pb2.WindowStats(
        deployment="llama",
        role="worker",
        requests=7,
        request_rate_rps=1.5,
        cache_hit_ratio=0.25,
        start_ms=0,
        end_ms=60_000,
        ttft_ms=telemetry_pb2.Percentiles(p50=100, p90=150, p99=420),
    )
    s.classes.add(
        slo_class="interactive", percentile=90, ttft_target_ms=2000, ttft_ms=150, met=True
    )
    resp = telemetry_pb2.QueryWindowResponse(
        total=s, slices=[s], relative_accuracy=0.01, source="memory"
    )
    out = render_windows(resp)
    assert "source memory" in out and "100/150/420" in out and "class interactive: p90" in out
    top = render_top([s], 60, "12:00:00")
    assert "llama" in top and "1.50" in top and "25%" in top
    assert "(no requests" in render_top([], 60, "12:00:00")
