"""Agent memory on a P/D fleet: a session's KV is on its prefill engine and, with
``decode_keeps_kv``, on its decode engine (its home); the retention controller's plan is
applied to both, so an idle session's KV on the decode engine is protected within the budget
or offloaded to the tier (not dropped by LRU), and a resumed turn's prefill fetches it."""

from __future__ import annotations

import pytest

from services.common.bench.traces import Trace, TraceRequest
from services.common.engine_core.kvcache import KVCache
from services.common.perfmodel import get_profile
from services.sim.config import SimConfig
from services.sim.memory import AgentMemory
from services.sim.run import Simulation

CHAIN = list(range(1, 9))


def _memory(mode: str, budget: float, eager: bool = False) -> AgentMemory:
    """Session ``a``'s turn computed on ``p0`` and decoded on ``d0`` (both cache its chain)."""
    caches = {"p0": KVCache(50, 64), "d0": KVCache(50, 64)}
    mem = AgentMemory(mode, caches, get_profile("test"), 64, budget_share=budget,
                      keep_unprotected=not eager)  # fmt: skip
    for c in caches.values():
        assert c.allocate("r", CHAIN, len(CHAIN)) is not None
        c.commit("r", CHAIN)
        c.release("r")
    mem.arrive("r", 0, "a", CHAIN, 1000.0)
    mem.end("r", "d0", 1000.0, prefill="p0")
    return mem


@pytest.mark.parametrize(
    ("mode", "budget", "eager", "want"),
    [
        # within the budget: kept on both engines, protected from LRU
        ("retention", 1.0, False, {"p0": (8, 8), "d0": (8, 8), "tier": 0}),
        # past the budget, engines with room: left on both as evictable cache
        ("retention", 0.0, False, {"p0": (8, 0), "d0": (8, 0), "tier": 0}),
        # past the budget, eager: offloaded from both to the tier
        ("retention", 0.0, True, {"p0": (0, 0), "d0": (0, 0), "tier": 8}),
        # LRU only: nothing protected, nothing offloaded
        ("lru", 1.0, False, {"p0": (8, 0), "d0": (8, 0), "tier": 0}),
    ],
    ids=["protected-on-both", "kept-on-both-while-room", "eager-offloaded-from-both",
         "lru-untouched"],
)  # fmt: skip
def test_the_plan_applies_to_prefill_and_decode_engines(
    mode: str, budget: float, eager: bool, want: dict[str, object]
) -> None:
    mem = _memory(mode, budget, eager)
    s = mem.table.get(("sim", "", "a"))
    assert (s.home_instance, mem.holders(s)) == ("d0", ("d0", "p0"))
    mem.tick(2000.0)
    got: dict[str, object] = {
        iid: (c.match(CHAIN), c.protected_blocks) for iid, c in mem.caches.items()
    }
    got["tier"] = sum(1 for h in CHAIN if h in mem._tier)
    assert got == want


def _trace() -> Trace:
    """Session A (ids 1..) takes a turn, goes idle 60 s; sessions B and C fill both engines
    meanwhile; A comes back with the same prefix plus one block."""
    a = tuple(range(1, 9))  # 8 blocks of 512 tokens
    rows = [(0.0, a), (5.0, tuple(range(100, 110))), (20.0, tuple(range(200, 210))),
            (60.0, (*a, 9))]  # fmt: skip
    reqs = tuple(TraceRequest(i, i + 1, t, len(h) * 512, 4, h) for i, (t, h) in enumerate(rows))
    return Trace("t", "mooncake", reqs)


@pytest.mark.parametrize(
    ("mode", "action", "reused"),
    [("lru", "gpu", False), ("retention", "fetch", True)],
    ids=["lru-drops-it", "retention-offloads-then-fetches"],
)
def test_pd_run_offloads_the_idle_session_and_fetches_it(
    mode: str, action: str, reused: bool
) -> None:
    cfg = SimConfig(prefill=1, decode=1, kv_blocks=150, block_size=64, agent_memory=mode,
                    decode_keeps_kv=True, memory_budget_share=0.0)  # fmt: skip
    sim = Simulation(cfg, _trace())
    run = sim.run()
    assert all(r.error is None for r in run.requests)
    assert sim.memory is not None
    s = sim.memory.table.get(("sim", "", "1"))
    assert sim.memory.holders(s) == ("decode-0", "prefill-0")
    (resume,) = sim.memory.resumes
    assert resume.action == action
    assert (resume.cached == resume.reusable) is reused
    # LRU dropped both engines' copies of A; retention offloaded them to the tier
    assert (sim.memory.summary()["reuse_ratio"] == 1.0) is reused
