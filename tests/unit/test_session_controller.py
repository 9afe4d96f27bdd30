"""The retention controller's per-engine decision (pure) and the engine cache's offload."""

from __future__ import annotations

import pytest

from services.common.engine_core.kvcache import KVCache
from services.common.sessions import Phase, Session
from services.common.sessions.controller import EngineKV, plan_engines

NOW = 1000.0


def sess(sid: str, home: str, phase: Phase, back_in: float | None, last: float = 900.0) -> Session:
    ret = NOW + back_in if back_in is not None else 0.0
    return Session("d", "t", sid, phase=phase, home_instance=home, last_turn_end=last,
                   predicted_return_at=ret)  # fmt: skip


CHAINS = {
    ("d", "t", "a"): (1, 2, 3, 4),  # 4 blocks
    ("d", "t", "b"): (1, 2, 5, 6, 7, 8),  # shares 1, 2 with a (a sub-agent of a's prefix)
    ("d", "t", "c"): (9, 10),
    ("d", "t", "x"): (11, 12),
}


THREE = [sess("a", "e0", Phase.IDLE, 5), sess("b", "e0", Phase.IDLE, 50),
         sess("c", "e0", Phase.IDLE, 10)]  # fmt: skip
EAGER = {"keep_unprotected": False}


@pytest.mark.parametrize(
    ("sessions", "capacity", "kw", "want"),
    [
        # budget 20% of 50 = 10 blocks: a (sooner) and b (6) do not both fit with c; a + c
        # fit; no pressure: b stays on the GPU, unmarked (neither protected nor offloaded)
        (THREE, 50, {}, {"e0": ((9, 10, 1, 2, 3, 4), ())}),  # protected: coldest first
        # the engine must free 4 blocks: b goes, leaf first
        (THREE, 50, {"need": 4}, {"e0": ((9, 10, 1, 2, 3, 4), (8, 7, 6, 5))}),
        # eager: every unprotected session offloaded at once
        (THREE, 50, EAGER, {"e0": ((9, 10, 1, 2, 3, 4), (8, 7, 6, 5))}),
        # overdue b is offloaded first; shared blocks of protected a stay
        ([sess("a", "e0", Phase.IDLE, 5), sess("b", "e0", Phase.IDLE, -1)], 50, {"need": 1},
         {"e0": ((1, 2, 3, 4), (8, 7, 6, 5))}),
        # an active session's turn has arrived: its chain is held (protected, never
        # offloaded, outside the budget) until the engine takes it; an ended one only
        # loses its marks
        ([sess("a", "e0", Phase.ACTIVE, None), sess("c", "e0", Phase.ENDED, None)], 50, EAGER,
         {"e0": ((1, 2, 3, 4), ())}),
        ([sess("a", "e0", Phase.ACTIVE, None)], 4, {"need": 4, "keep_unprotected": False,
         "budget_share": 0.0}, {"e0": ((1, 2, 3, 4), ())}),
        # a zero budget with pressure offloads idle sessions coldest first (no prediction
        # before the furthest predicted return) until the need is met
        ([sess("c", "e0", Phase.IDLE, 100), sess("x", "e0", Phase.IDLE, None)], 4, {"need": 2},
         {"e0": ((), (12, 11))}),
        ([sess("c", "e0", Phase.IDLE, 100), sess("x", "e0", Phase.IDLE, None)], 4, EAGER,
         {"e0": ((), (12, 11, 10, 9))}),
        # homes are per engine; a session homed on an unknown engine is skipped
        ([sess("a", "e0", Phase.IDLE, 5), sess("c", "e1", Phase.IDLE, 5),
          sess("x", "gone", Phase.IDLE, 5)], 50, {},
         {"e0": ((1, 2, 3, 4), ()), "e1": ((9, 10), ())}),
    ],
    ids=["budget-rest-kept", "pressure-offloads", "eager-offloads", "shared-blocks-stay",
         "active-held-ended-released", "active-held-under-pressure", "zero-budget-pressure-order", "zero-budget-eager-order",
         "per-engine"],
)  # fmt: skip
def test_plan_engines(
    sessions: list[Session], capacity: int, kw: dict[str, object], want: dict[str, object]
) -> None:
    need = int(kw.get("need", 0))  # type: ignore[call-overload]
    engines = {iid: EngineKV(capacity, need_blocks=need) for iid in ("e0", "e1")}
    eager = kw.get("keep_unprotected", True)
    share = float(kw.get("budget_share", 0.2))  # type: ignore[arg-type]
    got = plan_engines(sessions, CHAINS, engines, NOW, keep_unprotected=bool(eager),
                       budget_share=share)  # fmt: skip
    assert {iid: (p.protect, p.offload) for iid, p in got.items() if iid in want} == want
    assert all(not p.protect and not p.offload for iid, p in got.items() if iid not in want)


def test_session_without_chain_is_not_planned() -> None:
    got = plan_engines([sess("nochain", "e0", Phase.IDLE, 5)], CHAINS, {"e0": EngineKV(50)}, NOW)
    assert got["e0"].plan.protected == () and got["e0"].protect == ()


def _cache(hold: bool) -> KVCache:
    c = KVCache(8, 4, hold_evicted=hold)
    a = c.allocate("s", [1, 2, 3], 3)
    assert a is not None
    c.commit("s", [1, 2, 3])
    c.release("s")
    return c


@pytest.mark.parametrize("hold", [False, True], ids=["freed", "to-tier"])
def test_evict_now_offloads_named_unreferenced_blocks(hold: bool) -> None:
    c = _cache(hold)
    b = c.allocate("busy", [1], 2)  # block 1 in use again: not evicted
    assert b is not None
    assert c.evict_now([3, 1, 3, 99]) == 1
    assert c.match([1, 2, 3]) == 2
    assert [h for h, _ in c.drain_evicted()] == ([3] if hold else [])
