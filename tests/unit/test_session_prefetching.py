"""The retention controller's prefetch decisions (pure): which offloaded idle sessions to
bring back now, what became of the prefetches started, and that a session being prefetched
is held (protected, never offloaded) by the per-engine plan."""

from __future__ import annotations

import pytest

from services.common.perfmodel import get_profile
from services.common.sessions import Phase, Session, SessionKey
from services.common.sessions.controller import EngineKV, plan_engines
from services.common.sessions.prefetching import (
    EngineLink,
    Tracked,
    due_prefetches,
    job_id,
    offloaded,
    settle,
)

NOW = 1000.0
GPU, CPU = 1, 2
TEST = get_profile("test")  # 10 blocks of 16 tokens: fetch ~0.9 ms, recompute ~8 ms
LEAD = 0.5 + 0.86e-3 * 1.2  # margin_s + fetch x (1 + margin_ratio), about 0.501 s
CHAINS: dict[SessionKey, tuple[int, ...]] = {
    ("d", "t", s): tuple(range(i * 100, i * 100 + 10)) for i, s in enumerate("abcdefg")
}
LINKS = {"e0": EngineLink(TEST, 16), "notier": EngineLink(TEST, 16, has_tier=False)}


def sess(
    sid: str,
    back_in: float,
    *,
    phase: Phase = Phase.IDLE,
    tiers: tuple[tuple[int, int], ...] = ((CPU, 10),),
    home: str = "e0",
    turns: int = 1,
) -> Session:
    return Session("d", "t", sid, phase=phase, home_instance=home, tiers=tiers, turns=turns,
                   predicted_return_at=NOW + back_in if back_in else 0.0)  # fmt: skip


@pytest.mark.parametrize(
    ("s", "due"),
    [
        (sess("a", 0.4), True),  # inside the lead: start now
        (sess("a", LEAD + 0.3), False),  # later: not yet
        (sess("a", 0.4, tiers=((GPU, 10),)), False),  # resident: nothing to bring back
        (sess("a", 0.4, tiers=()), False),  # placement unknown (a turn just ended)
        (sess("a", 0.4, tiers=((GPU, 4), (CPU, 6))), False),  # partly resident: left alone
        (sess("a", -1.0), False),  # overdue: stays on the tier
        (sess("a", 0.0), False),  # no prediction
        (sess("a", 0.4, phase=Phase.ACTIVE), False),  # the turn is being served
        (sess("a", 0.4, phase=Phase.ENDED), False),
        (sess("a", 0.4, home="notier"), False),  # its engine has no tier to fetch from
        (sess("a", 0.4, home="unknown"), False),  # its engine did not answer
        (sess("z", 0.4), False),  # no chain known
    ],
    ids=[
        "in-lead", "not-yet", "resident", "unknown-placement", "partly-resident", "overdue",
        "no-prediction", "active", "ended", "no-tier", "unknown-engine", "no-chain",
    ],
)  # fmt: skip
def test_due(s: Session, due: bool) -> None:
    got = due_prefetches([s], CHAINS, LINKS, {}, NOW)
    assert bool(got) == due
    if due:
        (d,) = got
        assert (d.instance, d.hashes, d.job_id) == ("e0", CHAINS[s.key], "d/t/a#1")
        want = max(NOW, s.predicted_return_at - LEAD)  # never before now
        assert d.plan.fetch and d.plan.start_at == pytest.approx(want)


@pytest.mark.parametrize(
    ("tick_s", "due"), [(0.0, False), (0.5, True)], ids=["exact", "one-tick-early"]
)
def test_a_prefetch_due_before_the_next_tick_starts_now(tick_s: float, due: bool) -> None:
    got = due_prefetches([sess("a", LEAD + 0.3)], CHAINS, LINKS, {}, NOW, tick_s=tick_s)
    assert bool(got) == due


def test_not_worth_fetching_is_not_due() -> None:
    # h200 profile, one 16-token block: recomputing it costs nothing measurable
    links = {"e0": EngineLink(get_profile("h200-llama3.1-8b"), 16)}
    chains = {("d", "t", "a"): (1,)}
    assert due_prefetches([sess("a", 0.1, tiers=((CPU, 1),))], chains, links, {}, NOW) == []


def test_tracked_sessions_are_not_started_again_and_order_is_soonest_first() -> None:
    rows = [sess("a", 0.4), sess("b", 0.2), sess("c", 0.3)]
    tracked = {("d", "t", "c"): Tracked(("d", "t", "c"), "e0", "x", 1, NOW, 10)}
    assert [d.key[2] for d in due_prefetches(rows, CHAINS, LINKS, tracked, NOW)] == ["b", "a"]


def tracked(sid: str, **kw: object) -> Tracked:
    s = sess(sid, 1.0)
    return Tracked(s.key, "e0", job_id(s), 1, NOW - 1, 10, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("t", "now_s", "report", "outcomes", "still_held"),
    [
        (tracked("a"), sess("a", 1.0), {"d/t/a#1": "pending"}, set(), True),
        (tracked("a"), sess("a", 1.0), {"d/t/a#1": "done"}, {"finished"}, True),
        (tracked("a"), sess("a", 1.0), None, set(), True),  # engine did not answer
        (tracked("a"), sess("a", 1.0), {"d/t/a#1": "failed"}, {"failed"}, False),
        (tracked("a"), sess("a", 1.0), {}, {"failed"}, False),  # lost: the engine restarted
        (tracked("a", done=True), sess("a", 1.0, turns=2), {}, {"used"}, None),
        (tracked("a"), sess("a", 1.0, phase=Phase.ACTIVE, turns=2), {"d/t/a#1": "pending"},
         {"late"}, None),
        (tracked("a"), sess("a", 1.0, turns=2), {"d/t/a#1": "done"}, {"finished", "used"},
         None),  # seen done in the tick that sees the turn: not late
        (tracked("a", done=True), sess("a", -0.1), {}, {"expired"}, None),  # overdue
        (tracked("a", done=True), sess("a", 1.0, home="e1"), {}, {"expired"}, None),  # moved
        (tracked("a", done=True), sess("a", 0.0, phase=Phase.ENDED), {}, {"expired"}, None),
        (tracked("a", done=True), None, {}, {"expired"}, None),  # forgotten
        (tracked("a", failed=True), sess("a", 1.0, turns=2), {}, set(), None),  # counted before
    ],
    ids=[
        "pending", "finished", "no-report", "failed", "lost", "used", "late",
        "done-as-turn-came", "overdue", "re-homed", "ended", "forgotten", "failed-then-turn",
    ],
)  # fmt: skip
def test_settle(
    t: Tracked,
    now_s: Session | None,
    report: dict[str, str] | None,
    outcomes: set[str],
    still_held: bool | None,
) -> None:
    sessions = {t.key: now_s} if now_s is not None else {}
    got = settle({t.key: t}, sessions, {"e0": report}, NOW)
    names = ("finished", "failed", "late", "used", "expired")
    assert {n for n in names if getattr(got, n)} == outcomes
    if still_held is None:
        assert got.tracked == {}
    else:
        assert got.tracked[t.key].held == still_held  # a failed one stays, not held


def test_offloaded() -> None:
    assert offloaded(sess("a", 1.0))
    assert not offloaded(sess("a", 1.0, tiers=()))
    assert not offloaded(sess("a", 1.0, tiers=((GPU, 1), (CPU, 9))))


def test_a_held_session_is_protected_and_never_offloaded() -> None:
    # budget 0, eager: without the hold, both idle sessions would be offloaded
    rows = [sess("a", 0.3), sess("b", 0.3)]
    got = plan_engines(rows, CHAINS, {"e0": EngineKV(50)}, NOW, budget_share=0.0,
                       hold={("d", "t", "a")}, keep_unprotected=False)["e0"]  # fmt: skip
    assert got.protect == CHAINS[("d", "t", "a")]
    assert got.offload == tuple(reversed(CHAINS[("d", "t", "b")]))
    assert got.plan.offload == (("d", "t", "b"),)
