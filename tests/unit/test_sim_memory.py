"""Agent memory in the simulator: on a fleet too small for every session, an idle session's
prefix survives its gap under retention (on the GPU or the tier) and not under LRU; the
measurements are those of the benchmark; a scaled-in engine's sessions are migrated."""

from __future__ import annotations

import pytest

from services.common.bench.traces import Trace, TraceRequest
from services.common.engine_core.kvcache import KVCache
from services.common.perfmodel import get_profile
from services.sim.autoscale import AutoscaleConfig
from services.sim.config import SimConfig, SimConfigError
from services.sim.memory import AgentMemory
from services.sim.run import Simulation


def _trace() -> Trace:
    """Session A (ids 1..) takes a turn, goes idle 60 s; sessions B and C (ids 100.., 200..)
    fill the engine meanwhile; A comes back with the same prefix plus one block."""
    a = tuple(range(1, 9))  # 8 blocks of 512 tokens
    rows = [(0.0, a), (5.0, tuple(range(100, 110))), (20.0, tuple(range(200, 210))),
            (60.0, (*a, 9))]  # fmt: skip
    reqs = tuple(TraceRequest(i, i + 1, t, len(h) * 512, 4, h) for i, (t, h) in enumerate(rows))
    return Trace("t", "mooncake", reqs)


def _run(mode: str) -> dict[str, object]:
    cfg = SimConfig(engines=1, kv_blocks=150, block_size=64, agent_memory=mode,
                    memory_budget_share=0.6)  # fmt: skip
    sim = Simulation(cfg, _trace())
    run = sim.run()
    assert all(r.error is None for r in run.requests)
    assert sim.memory is not None
    return sim.memory.summary()


@pytest.mark.parametrize(
    ("mode", "kept"), [("lru", False), ("retention", True), ("prefetch", True)],
    ids=["lru-loses-it", "retention-keeps-it", "prefetch-keeps-it"],
)  # fmt: skip
def test_idle_prefix_survives_only_with_retention(mode: str, kept: bool) -> None:
    got = _run(mode)
    assert got["resumed_turns"] == 1
    ratio = got["reuse_ratio"]
    assert isinstance(ratio, float)
    assert (ratio == 1.0) is kept
    if not kept:
        assert ratio < 0.5


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(SimConfigError, match="agent-memory"):
        SimConfig(agent_memory="magic").validate()


def _served(mem: AgentMemory, session: str, hashes: list[int], iid: str, now: float) -> None:
    """One turn of ``session`` computed on ``iid``: its blocks cached there, the turn ended."""
    cache = mem.caches[iid]
    rid = f"{session}@{now}"
    assert cache.allocate(rid, hashes, len(hashes)) is not None
    cache.commit(rid, hashes)
    cache.release(rid)
    mem.arrive(rid, 0, session, hashes, now)
    mem.end(rid, iid, now)


@pytest.mark.parametrize(
    ("mode", "stay_kv", "want"),
    [
        # the session's 8 blocks go to the tier; it is re-homed where the router sends it
        ("retention", 50, ("e1", 8, {"migrate_move": 1, "move_fetch": 1})),
        # its home among those that stay lacks room: the tier all the same, re-homed
        ("retention", 4, ("e1", 8, {"migrate_tier": 1})),
        # the engines' LRU only: nothing moves (as before)
        ("lru", 50, ("e0", 0, {})),
    ],
    ids=["moved", "home-full-tier", "lru-nothing"],
)
def test_scale_in_migrates_the_sessions(
    mode: str, stay_kv: int, want: tuple[str, int, dict[str, int]]
) -> None:
    caches = {"e0": KVCache(50, 64), "e1": KVCache(stay_kv, 64)}
    mem = AgentMemory(mode, caches, get_profile("test"), 64)
    _served(mem, "a", list(range(1, 9)), "e0", 1000.0)
    assert mem.session_blocks() == {"e0": 8}
    mem.migrate("e0", ["e1"], 2000.0)
    s = mem.table.get(("sim", "", "a"))
    in_tier = sum(1 for h in range(1, 9) if h in mem._tier)
    assert (s.home_instance, in_tier, mem.counts) == want


def test_autoscaled_run_migrates_the_victims_sessions() -> None:
    """Six sessions take a turn, go idle, come back 400 s later: the quiet fleet scales in
    meanwhile, the victim's sessions are migrated as it leaves, and every resumed turn finds
    its prefix (the run does not fail on prefixes routed to the removed engine)."""
    rows = []
    for k in range(6):
        a = tuple(range(1000 * k + 1, 1000 * k + 9))
        rows += [(k * 1.0, a), (400.0 + k, (*a, 1000 * k + 9))]
    reqs = tuple(
        TraceRequest(i, i + 1, t, len(h) * 512, 4, h) for i, (t, h) in enumerate(sorted(rows))
    )
    cfg = SimConfig(engines=2, kv_blocks=150, block_size=64, agent_memory="retention",
                    autoscale=AutoscaleConfig(min_replicas=1, tick_s=5.0, window_s=10.0,
                                              startup_s=1.0))  # fmt: skip
    sim = Simulation(cfg, Trace("t", "mooncake", reqs))
    run = sim.run()
    assert all(r.error is None for r in run.requests)
    assert sum(i.removed for i in sim.engines) == 1
    assert sim.memory is not None and sim.memory.counts.get("migrate_move", 0) >= 1
    assert sim.memory.summary()["reuse_ratio"] == 1.0


@pytest.mark.parametrize(
    ("mode", "fetched"), [("retention", True), ("lru", False)],
    ids=["retention-looks-again-at-admission", "lru-recomputes"],
)  # fmt: skip
def test_turn_on_the_gpu_at_arrival_fetches_what_is_evicted_while_it_waits(
    mode: str, fetched: bool
) -> None:
    """The engine looks the tier up again when it admits the turn: the dispatch hands it
    the prefix as fetchable, used only if its own match at admission is shorter."""
    caches = {"e0": KVCache(50, 64)}
    mem = AgentMemory(mode, caches, get_profile("test"), 64)
    chain = list(range(1, 9))
    _served(mem, "a", chain, "e0", 1000.0)
    mem.arrive("r2", 1, "a", [*chain, 9], 2000.0)
    tokens, wait = mem.dispatch("r2", "e0", 9 * 64, 2000.0)
    assert (tokens, wait > 0) == ((8 * 64, True) if fetched else (0, False))
    assert mem.counts == {"gpu": 1}


def test_scale_in_spreads_the_moved_sessions_by_the_kv_they_bring() -> None:
    """Each moved session goes where the active sessions' KV is least, counting the ones
    moved before it; its prefix starts coming to its new home at once."""
    caches = {"e0": KVCache(50, 64), "e1": KVCache(50, 64), "e2": KVCache(50, 64)}
    mem = AgentMemory("retention", caches, get_profile("test"), 64)
    _served(mem, "x", list(range(100, 104)), "e1", 1000.0)  # 4 blocks active on e1
    _served(mem, "a", list(range(1, 9)), "e0", 1000.0)
    _served(mem, "b", list(range(20, 28)), "e0", 1000.0)
    plan = mem.migrate("e0", ["e1", "e2"], 2000.0)
    assert plan is not None
    assert [(sid, iid) for sid, iid, _ in mem.moved] == [("a", "e2"), ("b", "e1")]
    homes = {k: mem.table.get(("sim", "", k)).home_instance for k in ("a", "b", "x")}
    assert homes == {"a": "e2", "b": "e1", "x": "e1"}
    # a's next turn on its new home uses the prefix fetched meanwhile
    mem.arrive("ra", 1, "a", [*range(1, 9), 9], 10_000.0)
    assert mem.dispatch("ra", "e2", 9 * 64, 10_000.0) == (8 * 64, 0.0)
    assert mem.counts["use"] == 1


@pytest.mark.parametrize(
    ("rebalance", "want_home", "want_moved"),
    [(True, "e1", [("a", "e1")]), (False, "e0", [])],
    ids=["hot-spot-moves", "off-stays"],
)
def test_rebalancing_moves_an_idle_session_off_a_hot_engine(
    rebalance: bool, want_home: str, want_moved: list[tuple[str, str]]
) -> None:
    """Two idle sessions fill most of e0 while e1 holds none: with rebalancing, one moves
    (its chain to the tier, its home to e1) and its next turn there fetches its prefix
    from the tier; the other stays (moving it too would make e1 the hot one)."""
    caches = {"e0": KVCache(20, 64), "e1": KVCache(20, 64)}
    mem = AgentMemory("retention", caches, get_profile("test"), 64, rebalance=rebalance)
    _served(mem, "a", list(range(1, 9)), "e0", 1000.0)
    _served(mem, "b", list(range(20, 28)), "e0", 1000.0)
    mem.tick(2000.0)
    assert [(sid, iid) for sid, iid, _ in mem.rebalanced] == want_moved
    homes = {k: mem.table.get(("sim", "", k)).home_instance for k in ("a", "b")}
    assert homes == {"a": want_home, "b": "e0"}
    if rebalance:
        assert caches["e0"].match(list(range(1, 9))) == 0
        assert caches["e0"].match(list(range(20, 28))) == 8
        assert all(h in mem._tier for h in range(1, 9))
        mem.arrive("ra", 1, "a", [*range(1, 9), 9], 10_000.0)
        tokens, wait = mem.dispatch("ra", "e1", 9 * 64, 10_000.0)
        assert (tokens, wait > 0, mem.counts["fetch"]) == (8 * 64, True, 1)


@pytest.mark.parametrize(
    ("mode", "offloaded", "cached"),
    [("retention", True, 8), ("retention", False, 0), ("lru", False, 0)],
    ids=["tier-keeps-it", "only-on-the-dead-gpu", "lru-no-tier"],
)  # fmt: skip
def test_a_dead_engines_sessions_keep_only_what_the_tier_holds(
    mode: str, offloaded: bool, cached: int
) -> None:
    caches = {"e0": KVCache(50, 64), "e1": KVCache(50, 64)}
    mem = AgentMemory(mode, caches, get_profile("test"), 64)
    chain = list(range(1, 9))
    _served(mem, "a", chain, "e0", 1000.0)
    _served(mem, "b", list(range(20, 24)), "e1", 1000.0)  # not on the dead engine
    if offloaded:
        caches["e0"].evict_now(chain)
        mem.after_step(caches["e0"])
    del caches["e0"]  # the engine died (the simulation drops its cache)
    mem.engines_lost(["e0"])
    mem.arrive("r2", 1, "a", [*chain, 9], 2000.0)
    mem.dispatch("r2", "e1", 9 * 64, 2000.0)
    mem.dispatch("r2", "e1", 9 * 64, 2100.0)  # a retry is not a second resume
    assert [(r.index, r.reusable, r.cached) for r in mem.resumes] == [(1, 8, cached)]
    after = mem.summary()["after_failure"]
    assert after == {"sessions": 1, "resumed_turns": 1, "reuse_ratio": cached / 8}
