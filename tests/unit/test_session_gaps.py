"""Tool-time observations from request records: the pure gap tracker, the predictor's
percentile table, and telemetry's record observer."""

from __future__ import annotations

from typing import Any

import pytest
from tideserve.v1 import events_pb2

from services.common.sessions import ALL_TOOLS, NO_TOOL, ToolTimePredictor, TurnGaps
from services.common.sessions.gaps import Observation
from services.telemetry.tooltimes import ToolTimes
from tests.helpers.records import NOW_MS, record

# (arrival_s, end_s, tools, ok) per turn of one session, in the order the records arrive
Turn = tuple[float, float, tuple[str, ...], bool]


@pytest.mark.parametrize(
    ("turns", "want"),
    [
        ([(0, 5, ("bash",), True), (35, 40, (), True)], [None, Observation(("bash",), "", 30.0)]),
        (
            [(0, 5, ("read", "bash", "read"), True), (6, 8, (), True), (20, 21, (), True)],
            [None, Observation(("bash", "read"), "", 1.0), Observation((), "", 12.0)],
        ),
        # a turn arriving before the previous one ended overlapped it: no gap
        ([(0, 10, ("bash",), True), (8, 12, (), True)], [None, None]),
        # an older turn arriving late is no gap and does not replace the newer one
        (
            [(10, 12, ("grep",), True), (0, 5, ("bash",), True), (20, 21, (), True)],
            [None, None, Observation(("grep",), "", 8.0)],
        ),
        # a failed turn ends the wait with no tools
        ([(0, 5, ("bash",), False), (7, 9, (), True)], [None, Observation((), "", 2.0)]),
        # a redelivered record (same arrival) is no second gap
        ([(0, 5, ("bash",), True), (0, 5, ("bash",), True)], [None, None]),
    ],
    ids=["tool-then-next", "tools-deduplicated", "overlap", "late-older-turn", "failed-turn",
         "redelivered"],
)  # fmt: skip
def test_turn_gaps(turns: list[Turn], want: list[Observation | None]) -> None:
    gaps = TurnGaps()
    got = [gaps.turn("s", a, e, t, ok=ok) for a, e, t, ok in turns]
    assert got == want


def test_turn_gaps_forget_the_least_recent_session_first() -> None:
    gaps = TurnGaps(max_sessions=2)
    for key in ("a", "b", "a", "c"):
        gaps.turn(key, 0.0, 1.0, ())
    assert len(gaps) == 2
    assert gaps.turn("b", 5.0, 6.0, ()) is None  # "b" was forgotten, "a" was not
    assert gaps.turn("c", 5.0, 6.0, ()) == Observation((), "", 4.0)


def test_quantile_table_per_tool_agent_and_overall() -> None:
    p = ToolTimePredictor()
    for g in (10.0, 20.0, 30.0):
        p.observe(["bash"], "claude", g)
    p.observe([], "", 60.0)
    rows = {(r.agent, r.tool): r for r in p.quantiles([0.5, 1.0])}
    assert set(rows) == {("", ALL_TOOLS), ("", "bash"), ("", NO_TOOL), ("claude", "bash")}
    assert rows[("", ALL_TOOLS)].samples == 4 and rows[("claude", "bash")].samples == 3
    assert rows[("claude", "bash")].seconds == pytest.approx((20.0, 30.0), rel=0.03)
    assert [(r.agent, r.tool) for r in p.quantiles([0.9], min_samples=2)] == [
        ("", ALL_TOOLS), ("", "bash"), ("claude", "bash"),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="percentiles"):
        p.quantiles([0.0])


def _turn(rid: str, arrival_s: float, tools: tuple[str, ...] = (), **kw: Any) -> Any:
    r = record(rid, session_id=kw.pop("session", "s1"), arrival_ms=NOW_MS - 100_000 + int(
        arrival_s * 1000), finish_ms=NOW_MS - 100_000 + int((arrival_s + 2) * 1000), **kw)  # fmt: skip
    for t in tools:
        r.tool_calls.add(name=t, argument_bytes=3)
    return r


def test_telemetry_learns_tool_times_from_records_per_deployment() -> None:
    tt = ToolTimes()
    batch: list[events_pb2.RequestRecord] = []
    for s in range(5):  # five sessions: a bash call, the next turn 30 s after it ended
        batch += [_turn(f"{s}a", 0.0, ("bash",), session=f"s{s}"),
                  _turn(f"{s}b", 32.0, session=f"s{s}")]  # fmt: skip
    batch.append(_turn("x", 0.0, ("bash",), session="other", deployment="qwen"))
    batch.append(_turn("nosession", 0.0, ("bash",), session=""))
    tt.observe_records(NOW_MS, list(reversed(batch)))  # out of order in the batch
    rows = {(r.agent, r.tool): r for r in tt.table("llama", (0.5,))}
    assert rows[("", "bash")].samples == 5
    assert rows[("", "bash")].seconds[0] == pytest.approx(30.0, rel=0.03)
    assert tt.table("qwen") == [] and tt.table("nope") == []
    assert tt.sessions_tracked == 6
    with pytest.raises(ValueError, match="percentiles"):
        tt.table("nope", (1.5,))
