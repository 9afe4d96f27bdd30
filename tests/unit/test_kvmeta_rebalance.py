"""kvmeta's rebalancing shell: which engines take part, deployments kept apart, and a move
written into its source's retention plan."""

from __future__ import annotations

from typing import Any

import pytest

from services.common.sessions import Phase, RetentionPlan, Session
from services.common.sessions.controller import EngineRetention
from services.kvmeta.rebalance import Rebalancer

NOW = 1000.0
TIER = {"capacity_blocks": 20, "free_blocks": 20, "kvcache_tier": True}


def s(sid: str, home: str, dep: str = "d", phase: Phase = Phase.IDLE) -> Session:
    return Session(dep, "", sid, phase=phase, home_instance=home, last_turn_end=NOW - 1,
                   predicted_return_at=NOW + 300)  # fmt: skip


def chains(**kw: list[int]) -> dict[tuple[str, str, str], list[int]]:
    return {("d", "", k): v for k, v in kw.items()}


A, B = list(range(1, 9)), list(range(20, 28))


@pytest.mark.parametrize(
    ("rows", "infos", "want"),
    [
        # e0 homes two sessions (16 of 20 blocks), e1 one with no chain: one moves
        ([s("a", "e0"), s("b", "e0"), s("c", "e1")], {"e0": TIER, "e1": TIER},
         [("a", "e0", "e1")]),
        # e1 has no tier: it can take nothing (and e0 alone is no fleet)
        ([s("a", "e0"), s("b", "e0"), s("c", "e1")],
         {"e0": TIER, "e1": {**TIER, "kvcache_tier": False}}, []),
        # e1 did not answer
        ([s("a", "e0"), s("b", "e0"), s("c", "e1")], {"e0": TIER, "e1": None}, []),
        # e1's only session is of another deployment: no destination in d
        ([s("a", "e0"), s("b", "e0"), s("c", "e1", dep="x")], {"e0": TIER, "e1": TIER}, []),
        # an ended session does not make its engine a destination
        ([s("a", "e0"), s("b", "e0"), s("c", "e1", phase=Phase.ENDED)],
         {"e0": TIER, "e1": TIER}, []),
    ],
    ids=["moves-one", "no-tier", "no-answer", "other-deployment", "ended-home"],
)  # fmt: skip
def test_plan(rows: list[Session], infos: dict[str, Any], want: list[tuple[str, str, str]]) -> None:
    got = Rebalancer().plan(rows, chains(a=A, b=B), infos, NOW)
    assert [(m.key[2], m.source, m.destination) for m in got] == want


def test_a_session_moved_is_not_moved_again_within_the_cooldown() -> None:
    r = Rebalancer(cooldown_s=60.0)
    rows = [s("a", "e0"), s("b", "e0"), s("c", "e1")]
    infos = {"e0": TIER, "e1": TIER}

    def moved(at: float) -> list[str]:
        return [m.key[2] for m in r.plan(rows, chains(a=A, b=B), infos, at)]

    assert moved(NOW) == ["a"]
    # the table not updated (as if the move had failed): a is held back, b goes instead
    assert moved(NOW + 10) == ["b"]
    assert moved(NOW + 61) == ["a"]


def test_apply_offloads_the_chain_but_what_another_session_there_shares() -> None:
    rows = [s("a", "e0"), s("b", "e0"), s("c", "e1")]
    ch = chains(a=A, b=[1, 2, *range(30, 36)])  # b shares a's first two blocks
    moves = Rebalancer().plan(rows, ch, {"e0": TIER, "e1": TIER}, NOW)
    assert [m.key[2] for m in moves] == ["a"]
    plans = {
        "e0": EngineRetention(
            (*A, *ch[("d", "", "b")][2:]), (), RetentionPlan((), (), (), (), 0, 0)
        )
    }
    Rebalancer.apply(moves, plans, rows, ch)
    assert plans["e0"].offload == tuple(reversed(A[2:]))
    assert set(plans["e0"].protect) == {1, 2, *range(30, 36)}
