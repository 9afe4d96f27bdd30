"""Hot-spot rebalancing of agent sessions (pure)."""

from __future__ import annotations

import pytest

from services.common.sessions import Phase
from services.common.sessions.migration import Migrant
from services.common.sessions.rebalance import InstanceKV, RebalanceParams, plan_rebalance

NOW = 1000.0


def m(sid: str, blocks: int, phase: Phase = Phase.IDLE, back_in: float | None = 30.0) -> Migrant:
    ret = NOW + back_in if back_in is not None else None
    return Migrant(("d", "t", sid), blocks, phase, sid, ret, 900.0)


def inst(iid: str, active: int, room: int = 1000, cap: int = 1000) -> InstanceKV:
    return InstanceKV(iid, cap, active, room)


HOT = inst("e0", 800)
COOL = inst("e1", 100)


@pytest.mark.parametrize(
    ("instances", "idle", "params", "recent", "want"),
    [
        # the hot instance's largest idle session goes to the coolest; the second would
        # overshoot (e1 would hold more than e0 after it)
        ([HOT, COOL], {"e0": [m("a", 300), m("b", 200)]}, None, (),
         [("a", "e0", "e1", 300)]),
        # largest first, then the next while the gap still narrows
        ([HOT, COOL], {"e0": [m("a", 100), m("b", 200)]}, None, (),
         [("b", "e0", "e1", 200), ("a", "e0", "e1", 100)]),
        # the coolest of several destinations, counting the moves before
        ([inst("e0", 900), inst("e1", 300), inst("e2", 100)],
         {"e0": [m("a", 200), m("b", 150)]}, None, (),
         [("a", "e0", "e2", 200), ("b", "e0", "e1", 150)]),
        # below hot_share of its capacity: not a hot spot, however uneven
        ([inst("e0", 400), inst("e1", 0)], {"e0": [m("a", 100)]}, None, (), []),
        # under hot_ratio x the mean: balanced enough
        ([inst("e0", 800), inst("e1", 700)], {"e0": [m("a", 50)]}, None, (), []),
        # a session returning sooner than min_lead_s, or with no prediction, stays
        ([HOT, COOL], {"e0": [m("a", 100, back_in=2.0), m("b", 100, back_in=None)]}, None,
         (), []),
        # an ACTIVE or ENDED one stays, as does one moved recently
        ([HOT, COOL], {"e0": [m("a", 100, Phase.ACTIVE), m("b", 100, Phase.ENDED),
                              m("c", 100)]}, None, [("d", "t", "c")], []),
        # no destination with room: nothing moves
        ([HOT, inst("e1", 100, room=50)], {"e0": [m("a", 100)]}, None, (), []),
        # at most max_moves per round
        ([HOT, COOL], {"e0": [m("a", 50), m("b", 50), m("c", 50)]},
         RebalanceParams(max_moves=2), (), [("a", "e0", "e1", 50), ("b", "e0", "e1", 50)]),
        # one instance: nowhere to go
        ([HOT], {"e0": [m("a", 100)]}, None, (), []),
        # idle sessions of a cool instance are not moved
        ([HOT, COOL], {"e1": [m("a", 50)]}, None, (), []),
    ],
    ids=["largest-no-overshoot", "largest-first", "coolest-counted", "not-full",
         "balanced", "too-soon-or-unknown", "active-ended-recent", "no-room", "max-moves",
         "one-instance", "cool-sessions"],
)  # fmt: skip
def test_plan_rebalance(
    instances: list[InstanceKV],
    idle: dict[str, list[Migrant]],
    params: RebalanceParams | None,
    recent: list[tuple[str, str, str]],
    want: list[tuple[str, str, str, int]],
) -> None:
    got = plan_rebalance(instances, idle, NOW, params, recently_moved=recent)
    assert [(mv.key[2], mv.source, mv.destination, mv.blocks) for mv in got] == want


@pytest.mark.parametrize(
    "kwargs",
    [
        {"hot_share": 0.0},
        {"hot_share": 1.5},
        {"hot_ratio": 1.0},
        {"min_lead_s": -1.0},
        {"max_moves": 0},
    ],
    ids=["share-0", "share-over-1", "ratio-1", "lead-negative", "moves-0"],
)
def test_params_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RebalanceParams(**kwargs)  # type: ignore[arg-type]


def test_negative_blocks_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        plan_rebalance([inst("e0", -1), COOL], {}, NOW)
