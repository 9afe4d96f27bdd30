"""Sessions kept on the GPU and evicted on demand by their engine are recorded on the tier
(pure rule, and kvmeta's retention controller applying it with a fake ``locate``), so the
prefetch plan covers them as it covers sessions the controller offloaded itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from services.common.perfmodel import get_profile
from services.common.sessions import Phase, Session, SessionKey
from services.common.sessions.prefetching import (
    EngineLink,
    due_prefetches,
    evicted_to_tier,
    may_be_evicted,
)
from services.kvmeta.retention import evicted_placements

NOW = 1000.0
GPU, CPU = 1, 2
CHAIN = 10


def sess(
    *,
    phase: Phase = Phase.IDLE,
    tiers: tuple[tuple[int, int], ...] = (),
    ended: float = NOW - 5.0,
    sid: str = "a",
    back_in: float = 0.4,
) -> Session:
    return Session("d", "t", sid, phase=phase, home_instance="e0", tiers=tiers,
                   last_turn_end=ended, predicted_return_at=NOW + back_in)  # fmt: skip


@pytest.mark.parametrize(
    ("s", "on_gpu", "on_tier", "want"),
    [
        (sess(), 0, 10, {CPU: 10}),  # evicted whole, offloaded on eviction
        (sess(), 4, 10, {CPU: 10}),  # evicted in part: the tier holds the chain
        (sess(tiers=((GPU, 10),)), 0, 10, {CPU: 10}),  # was recorded on the GPU
        (sess(), 0, 6, {CPU: 6}),  # the tier holds a leading run only
        (sess(), 10, 10, None),  # resident (write-through: on both)
        (sess(), 0, 0, None),  # evicted, not stored (no tier): nothing to fetch
        (sess(), 4, 4, None),  # the tier holds no more than the GPU
        (sess(tiers=((CPU, 10),)), 0, 10, None),  # recorded offloaded already
        (sess(phase=Phase.ACTIVE), 0, 10, None),  # its turn is being served
        (sess(phase=Phase.ENDED), 0, 10, None),
        (sess(ended=NOW - 0.5), 0, 10, None),  # just idle: the index may lag the turn
    ],
    ids=[
        "evicted-whole", "evicted-in-part", "recorded-on-gpu", "tier-run-shorter", "resident",
        "not-stored", "tier-no-longer", "offloaded-already", "active", "ended", "just-idle",
    ],
)  # fmt: skip
def test_evicted_to_tier(
    s: Session, on_gpu: int, on_tier: int, want: dict[int, int] | None
) -> None:
    assert evicted_to_tier(s, CHAIN, on_gpu, on_tier, NOW, min_idle_s=1.0) == want
    if want is not None:
        assert may_be_evicted(s, NOW, 1.0)


def test_a_session_recorded_on_the_tier_is_prefetched() -> None:
    s = sess()
    chains: dict[SessionKey, tuple[int, ...]] = {s.key: tuple(range(CHAIN))}
    links = {"e0": EngineLink(get_profile("test"), 16)}
    assert due_prefetches([s], chains, links, {}, NOW) == []  # kept: nothing to bring back
    tiers = evicted_to_tier(s, CHAIN, 0, CHAIN, NOW, 1.0)
    assert tiers is not None
    placed = replace(s, tiers=tuple(tiers.items()))
    (d,) = due_prefetches([placed], chains, links, {}, NOW)
    assert d.hashes == chains[s.key] and d.instance == "e0"


class FakeLocate:
    """Where each session's prefix is, by session id; records the sessions looked up."""

    def __init__(self, where: dict[str, tuple[int, int]]) -> None:
        self.where = where
        self.asked: list[str] = []

    def __call__(self, s: Session, chain: Sequence[int]) -> tuple[int, int]:
        self.asked.append(s.session_id)
        return self.where[s.session_id]


def test_the_controller_looks_up_only_sessions_that_may_be_evicted() -> None:
    rows = [
        sess(sid="gone"),  # evicted to the tier
        sess(sid="here"),  # resident
        sess(sid="fetching"),  # a prefetch is bringing it back: left alone
        sess(sid="busy", phase=Phase.ACTIVE),
        sess(sid="nochain"),
    ]
    chains = {s.key: tuple(range(CHAIN)) for s in rows if s.session_id != "nochain"}
    locate = FakeLocate({"gone": (0, 10), "here": (10, 10), "fetching": (0, 10)})
    skip = {rows[2].key}
    got = evicted_placements(rows, chains, skip, locate, NOW, 1.0)
    assert got == [(rows[0].key, {CPU: 10})]
    assert locate.asked == ["gone", "here"]
