"""The session table: turns, predicted returns, placement, tenants, expiry, changes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.common.sessions import (
    InvalidSessionError,
    Phase,
    SessionError,
    SessionKey,
    SessionNotFoundError,
    SessionsExhaustedError,
    SessionTable,
    ToolTimePredictor,
)

K: SessionKey = ("d", "t", "s1")


def table(**kw: float | int) -> SessionTable:
    pred = ToolTimePredictor(min_samples=2, session_min_samples=2, default_gap_s=30.0)
    return SessionTable(pred, percentile=0.5, idle_timeout_s=100.0, ended_retention_s=10.0, **kw)  # type: ignore[arg-type]


def test_turn_end_predicts_return_from_the_tools_history() -> None:
    t = table()
    t.turn_start(K, 0.0, agent="claude", home_instance="e1")
    s = t.turn_end(K, 1.0, tip_hash=7, tip_tokens=512, tool_names=["bash"])
    assert (s.phase, s.prediction_source, s.predicted_return_at) == (Phase.IDLE, "default", 31.0)
    for start in (6.0, 12.0):  # two 5 s gaps after bash
        t.turn_start(K, start)
        s = t.turn_end(K, start + 1.0, tool_names=["bash"])
    assert s.prediction_source == "agent_tool"
    assert s.predicted_return_at == pytest.approx(13.0 + 5.0, rel=0.01)
    assert s.recent_gaps == (5.0, 5.0)
    assert (s.turns, s.tip_hash, s.tip_tokens, s.home_instance) == (3, 7, 512, "e1")


@pytest.mark.parametrize(
    ("steps", "phase"),
    [
        ([("start", 0.0), ("end", 1.0)], Phase.IDLE),
        ([("start", 0.0), ("final", 1.0)], Phase.ENDED),
        ([("start", 0.0), ("final", 1.0), ("start", 2.0)], Phase.ACTIVE),
        ([("end", 1.0)], Phase.IDLE),
        ([("start", 0.0), ("start", 0.5), ("end", 1.0)], Phase.IDLE),
        ([("start", 0.0), ("end_session", 1.0)], Phase.ENDED),
    ],
    ids=[
        "idle-after-turn",
        "final-ends",
        "reopened-after-end",
        "end-without-start-creates",
        "concurrent-turns",
        "explicit-end",
    ],
)
def test_phases(steps: list[tuple[str, float]], phase: Phase) -> None:
    t = table()
    ops: dict[str, Callable[[float], object]] = {
        "start": lambda now: t.turn_start(K, now),
        "end": lambda now: t.turn_end(K, now),
        "final": lambda now: t.turn_end(K, now, final=True),
        "end_session": lambda now: t.end(K, now),
    }
    for op, now in steps:
        ops[op](now)
    assert t.get(K).phase is phase


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda t: t.turn_start(("", "t", "s"), 0.0), InvalidSessionError),
        (lambda t: t.turn_start(("d", "t", ""), 0.0), InvalidSessionError),
        (lambda t: t.turn_start(K, -1.0), InvalidSessionError),
        (lambda t: t.turn_end(K, 0.0, tip_tokens=-1), InvalidSessionError),
        (lambda t: t.set_placement(K, 0.0, home_instance="e", tiers={1: 3}), SessionNotFoundError),
        (lambda t: t.end(K, 0.0), SessionNotFoundError),
        (lambda t: t.get(K), SessionNotFoundError),
    ],
    ids=[
        "no-deployment",
        "no-session-id",
        "negative-time",
        "negative-tokens",
        "placement-unknown",
        "end-unknown",
        "get-unknown",
    ],
)
def test_errors_change_nothing(
    call: Callable[[SessionTable], object], error: type[SessionError]
) -> None:
    t = table()
    with pytest.raises(error):
        call(t)
    assert len(t) == 0
    assert t.drain_changes() == {}


def test_placement_keeps_tiers_sorted_and_drops_empty_ones() -> None:
    t = table()
    t.turn_start(K, 0.0)
    s = t.set_placement(K, 1.0, home_instance="e2", tiers={2: 4, 1: 10, 3: 0})
    assert (s.home_instance, s.tiers, s.blocks) == ("e2", ((1, 10), (2, 4)), 14)
    with pytest.raises(InvalidSessionError):
        t.set_placement(K, 1.0, home_instance="e2", tiers={0: 1})


def test_tenants_never_see_each_other() -> None:
    t = table()
    t.turn_start(("d", "alice", "same"), 0.0)
    t.turn_start(("d", "bob", "same"), 1.0)
    t.turn_end(("d", "bob", "same"), 2.0, tool_names=["bash"])
    assert [s.tenant for s in t.list("d", "alice")] == ["alice"]
    assert t.get(("d", "alice", "same")).phase is Phase.ACTIVE
    assert [s.session_id for s in t.list("d", "bob", phase=Phase.IDLE)] == ["same"]
    assert t.list("d", "carol") == []


def test_list_filters_by_instance_and_limits() -> None:
    t = table()
    for i in range(4):
        t.turn_start(("d", "t", f"s{i}"), float(i), home_instance=f"e{i % 2}")
    assert [s.session_id for s in t.list("d", "t", home_instance="e1")] == ["s1", "s3"]
    assert [s.session_id for s in t.list("d", "t", limit=2)] == ["s0", "s1"]


@pytest.mark.parametrize(
    ("now", "phase_after", "gone"),
    [(50.0, Phase.IDLE, False), (101.0, Phase.ENDED, False), (111.0, None, True)],
    ids=["quiet-but-within-timeout", "idle-timeout-ends", "forgotten-after-retention"],
)
def test_expire(now: float, phase_after: Phase | None, gone: bool) -> None:
    t = table()
    t.turn_start(K, 0.0)
    t.turn_end(K, 1.0)
    ended, forgotten = t.expire(now)
    if gone:  # two expiry passes: end, then forget
        assert forgotten == [] and [s.key for s in ended] == [K]
        ended, forgotten = t.expire(now + 10.0)
        assert forgotten == [K]
        assert t.drain_changes()[K] is None
        return
    assert t.get(K).phase is phase_after
    assert bool(ended) is (phase_after is Phase.ENDED)


def test_stuck_active_turn_expires() -> None:
    t = table()
    t.turn_start(K, 0.0)
    assert [s.key for s in t.expire(100.0)[0]] == [K]


def test_capacity_bound_refuses_new_sessions_only() -> None:
    t = table(max_sessions=1)
    t.turn_start(K, 0.0)
    with pytest.raises(SessionsExhaustedError):
        t.turn_start(("d", "t", "other"), 1.0)
    t.turn_end(K, 2.0)  # an existing session still updates


def test_changes_drain_requeue_and_load() -> None:
    t = table()
    t.turn_start(K, 0.0)
    changes = t.drain_changes()
    assert list(changes) == [K]
    assert t.drain_changes() == {}
    t.turn_end(K, 1.0, tool_names=["bash"])
    t.requeue_changes(changes)  # the newer row wins over the requeued one
    row = t.drain_changes()[K]
    assert row is not None and row.phase is Phase.IDLE
    fresh = table()
    fresh.load([row])
    assert fresh.get(K) == row
    assert fresh.drain_changes() == {}
