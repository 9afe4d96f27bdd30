"""The migration plan of a scaled-in instance's sessions (pure)."""

from __future__ import annotations

import pytest

from services.common.sessions import Phase, Session
from services.common.sessions.homes import rendezvous_home
from services.common.sessions.migration import (
    Destination,
    Fate,
    HomeKV,
    Migrant,
    active_kv,
    active_sessions,
    homes_kv,
    migrant,
    plan_migration,
)

NOW = 1000.0
DESTS = (Destination("e1", 100, load=5), Destination("e2", 100, load=1))
HOME = "<home>"  # the session's rendezvous home among DESTS


def m(
    sid: str,
    blocks: int,
    phase: Phase = Phase.IDLE,
    back_in: float | None = 10.0,
    last: float = 900.0,
    parent: str = "",
) -> Migrant:
    ret = NOW + back_in if back_in is not None else None
    return Migrant(("d", "t", sid), blocks, phase, parent or sid, ret, last)  # fmt: skip


def home(route: str, dests: tuple[Destination, ...] = DESTS) -> str:
    got = rendezvous_home(route, [d.instance_id for d in dests])
    assert got is not None
    return got


@pytest.mark.parametrize(
    ("sessions", "dests", "tier", "placement", "want"),
    [
        # an ended session is dropped; a live one moves to its rendezvous home
        ([m("a", 4), m("z", 4, Phase.ENDED)], DESTS, None, "rendezvous",
         [("a", Fate.MOVE, HOME), ("z", Fate.DROP, "")]),
        # no destination at all: to the tier
        ([m("a", 4)], (), None, "rendezvous", [("a", Fate.TIER, "")]),
        # the home lacks room: the tier, not another instance the router would not pick
        ([m("a", 4)], (Destination("e1", 3), Destination("e2", 3)), None, "rendezvous",
         [("a", Fate.TIER, "")]),
        # least_loaded: the least-loaded destination with room
        ([m("a", 4)], DESTS, None, "least_loaded", [("a", Fate.MOVE, "e2")]),
        ([m("a", 4)], (Destination("e1", 100, 5), Destination("e2", 3, 1)), None,
         "least_loaded", [("a", Fate.MOVE, "e1")]),
        # equal load: the one with more room, then the id
        ([m("a", 4)], (Destination("e1", 50), Destination("e2", 60)), None, "least_loaded",
         [("a", Fate.MOVE, "e2")]),
        # room is shared: the session returning soonest gets it, the next goes to the tier
        ([m("late", 6, back_in=50), m("soon", 6, back_in=5)],
         (Destination("e1", 8), Destination("e2", 8)), None, "least_loaded",
         [("soon", Fate.MOVE, "e1"), ("late", Fate.MOVE, "e2")]),
        ([m("late", 6, back_in=50), m("soon", 6, back_in=5)], (Destination("e1", 8),), None,
         "least_loaded", [("soon", Fate.MOVE, "e1"), ("late", Fate.TIER, "")]),
        # kv_spread: load is the KV homed there; each move adds its blocks before the next
        # is placed, so the victim's sessions spread instead of all landing on one
        ([m("big", 60, back_in=5), m("mid", 30, back_in=10), m("small", 10, back_in=20)],
         (Destination("e1", 500, 20), Destination("e2", 500, 40), Destination("e3", 500, 45)),
         None, "kv_spread",
         [("big", Fate.MOVE, "e1"), ("mid", Fate.MOVE, "e2"), ("small", Fate.MOVE, "e3")]),
        # least_loaded keeps its load as given (every session onto the same instance)
        ([m("big", 60, back_in=5), m("mid", 30, back_in=10), m("small", 10, back_in=20)],
         (Destination("e1", 500, 20), Destination("e2", 500, 40), Destination("e3", 500, 45)),
         None, "least_loaded",
         [("big", Fate.MOVE, "e1"), ("mid", Fate.MOVE, "e1"), ("small", Fate.MOVE, "e1")]),
        # kv_spread needs room too: the least loaded without room is passed over
        ([m("a", 40)], (Destination("e1", 30, 0), Destination("e2", 50, 90)), None,
         "kv_spread", [("a", Fate.MOVE, "e2")]),
        # the tier's room is short too: the warmest that fit go, the rest are dropped
        ([m("a", 5, back_in=5), m("b", 5, back_in=20), m("c", 2, back_in=30)], (), 7,
         "rendezvous", [("a", Fate.TIER, ""), ("b", Fate.DROP, ""), ("c", Fate.TIER, "")]),
        # warmth: active, then returns ahead (soonest first), no prediction, overdue
        ([m("over", 1, back_in=-5), m("none", 1, back_in=None), m("ahead", 1, back_in=30),
          m("act", 1, Phase.ACTIVE, back_in=None)], (), 2, "rendezvous",
         [("act", Fate.TIER, ""), ("ahead", Fate.TIER, ""), ("none", Fate.DROP, ""),
          ("over", Fate.DROP, "")]),
    ],
    ids=["move-home-drop-ended", "no-destination", "home-full-to-tier", "least-loaded",
         "least-loaded-with-room", "least-loaded-tie", "room-shared", "soonest-gets-room",
         "kv-spread", "least-loaded-does-not-spread", "kv-spread-needs-room", "tier-short",
         "warmth-order"],
)  # fmt: skip
def test_plan(
    sessions: list[Migrant],
    dests: tuple[Destination, ...],
    tier: int | None,
    placement: str,
    want: list[tuple[str, Fate, str]],
) -> None:
    plan = plan_migration(sessions, dests, NOW, tier_free_blocks=tier, placement=placement)  # type: ignore[arg-type]
    got = [(mv.key[2], mv.fate, mv.instance) for mv in plan.moves]
    expect = [(sid, f, home(sid, dests) if i == HOME else i) for sid, f, i in want]
    assert got == expect


def test_sub_agent_follows_its_parent_home() -> None:
    """A sub-agent is placed by its parent's id, as the session-home scorer places it."""
    dests = tuple(Destination(f"e{i}", 100) for i in range(8))
    plan = plan_migration([m(f"sub{i}", 1, parent="p") for i in range(10)], dests, NOW)
    assert {mv.instance for mv in plan.moves} == {home("p", dests)}


def test_rendezvous_agrees_with_the_router_after_the_victim_is_gone() -> None:
    """The destination is where the router's session-home ranks the session once the victim
    has left the candidates; sessions homed elsewhere never need to move."""
    fleet = [f"e{i}" for i in range(5)]
    victim_sessions = [f"s{i}" for i in range(200) if rendezvous_home(f"s{i}", fleet) == "e3"]
    dests = tuple(Destination(i, 10_000) for i in fleet if i != "e3")
    plan = plan_migration([m(s, 2) for s in victim_sessions], dests, NOW)
    assert victim_sessions
    for mv in plan.moves:
        assert mv.instance == rendezvous_home(mv.key[2], [i for i in fleet if i != "e3"])


def test_totals_and_migrant_from_session() -> None:
    s = Session("d", "t", "kid", parent_session_id="p", phase=Phase.IDLE,
                predicted_return_at=NOW + 5, last_turn_end=990.0, turn_started_at=980.0)  # fmt: skip
    mg = migrant(s, 7)
    assert (mg.route, mg.blocks, mg.predicted_return_at, mg.last_use) == ("p", 7, NOW + 5, 990.0)
    assert migrant(Session("d", "t", "x"), 0).predicted_return_at is None
    plan = plan_migration([mg, m("z", 3, Phase.ENDED)], (), NOW, tier_free_blocks=100)
    assert (plan.blocks(Fate.TIER), plan.blocks(Fate.DROP), plan.blocks(Fate.MOVE)) == (7, 3, 0)
    assert [mv.reason for mv in plan.moves] == ["no_destination", "ended"]
    assert plan.of(Fate.TIER)[0].key == ("d", "t", "kid")


@pytest.mark.parametrize(
    ("kwargs", "sessions", "dests"),
    [
        ({"tier_free_blocks": -1}, [], ()),
        ({"placement": "random"}, [], ()),
        ({}, [m("a", -1)], ()),
        ({}, [], (Destination("e1", -1),)),
    ],
    ids=["negative-tier", "unknown-placement", "negative-blocks", "negative-room"],
)
def test_bad_input(kwargs: dict[str, object], sessions: list[Migrant],
                   dests: tuple[Destination, ...]) -> None:  # fmt: skip
    with pytest.raises(ValueError):
        plan_migration(sessions, dests, NOW, **kwargs)  # type: ignore[arg-type]


def test_homes_kv() -> None:
    rows = [
        Session("d", "t1", "a", phase=Phase.IDLE, home_instance="e1", tip_tokens=100,
                tiers=((0, 6),)),
        Session("d", "t2", "b", phase=Phase.ACTIVE, home_instance="e1", tip_tokens=50),
        Session("d", "t1", "c", phase=Phase.ENDED, home_instance="e1", tiers=((0, 9),)),
        Session("d", "t1", "n", phase=Phase.IDLE, tiers=((0, 9),)),
        Session("d", "t1", "e", phase=Phase.IDLE, home_instance="e2", tiers=((1, 2),)),
    ]  # fmt: skip
    got = homes_kv(rows, {("d", "t2", "b"): 3})
    assert got == {"e1": HomeKV(2, 9, 150), "e2": HomeKV(1, 2, 0)}


def _active(sid: str, home: str = "e0", phase: Phase = Phase.IDLE, end: float = 0.0,
       ret: float = 0.0) -> Session:  # fmt: skip
    return Session("sim", "", sid, phase=phase, home_instance=home, last_turn_end=end,
                   predicted_return_at=ret)  # fmt: skip


@pytest.mark.parametrize(
    ("session", "active"),
    [
        (_active("a", phase=Phase.ACTIVE), True),
        (_active("a", end=950.0), True),  # ended 50 s ago, within the 100 s window
        (_active("a", end=900.0), True),  # exactly at the window's edge
        (_active("a", end=850.0), False),  # 150 s ago, no prediction
        (_active("a", end=850.0, ret=1010.0), True),  # old, but predicted back after now
        (_active("a", end=850.0, ret=990.0), False),  # overdue
        (_active("a", phase=Phase.ENDED, end=990.0, ret=1010.0), False),
        (_active("a", home="e1", phase=Phase.ACTIVE), False),  # homed elsewhere
        (_active("a"), False),  # never finished a turn, not active
    ],
    ids=["in-flight", "recent", "window-edge", "stale", "return-ahead", "overdue", "ended",
         "other-home", "no-turn"],
)  # fmt: skip
def test_active_sessions(session: Session, active: bool) -> None:
    assert (active_sessions([session], "e0", 1000.0, 100.0) == [session]) is active


def test_active_kv_sums_each_homes_active_chains() -> None:
    rows = [
        _active("a", phase=Phase.ACTIVE),
        _active("b", end=950.0),
        _active("c", end=100.0),  # stale: not counted
        _active("d", home="e1", end=990.0),
    ]
    blocks = {("sim", "", "a"): 30, ("sim", "", "d"): 7}  # "b" has no chain: its own blocks
    assert active_kv(rows, blocks, ["e0", "e1", "e2"], 1000.0, 100.0) == {
        "e0": 30 + rows[1].blocks,
        "e1": 7,
        "e2": 0,
    }
