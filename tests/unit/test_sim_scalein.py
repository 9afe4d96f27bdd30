"""The simulator's explicit scale-in: how much of a prefix is still cached, and a tiny run where one engine of two leaves mid-run (drained,
then migrated in the offload modes, dropped under LRU)."""

from __future__ import annotations

import pytest

from services.common.bench.traces import Trace, TraceRequest
from services.sim.autoscale import AutoscaleConfig
from services.sim.config import SimConfig, SimConfigError
from services.sim.run import Simulation
from services.sim.scalein import kept_prefix


@pytest.mark.parametrize(
    ("gpu_runs", "tier", "want"),
    [
        ((), set(), 0),  # gone everywhere
        ((), {1, 2, 3, 4}, 4),  # all on the tier
        ((2, 0), {3}, 3),  # GPU 2 on one engine, the tier continues it
        ((0, 3), {1}, 3),  # the longest of the engines' GPU runs
        ((1,), {3, 4}, 1),  # the tier has a gap: only the leading run counts
        ((6,), set(), 4),  # a GPU run past the chain (a longer turn cached): the chain
    ],
    ids=["dropped", "tier", "gpu-then-tier", "best-engine", "gap", "capped"],
)
def test_kept_prefix(gpu_runs: tuple[int, ...], tier: set[int], want: int) -> None:
    assert kept_prefix((1, 2, 3, 4), gpu_runs, tier.__contains__) == want


def _trace() -> Trace:
    """Six sessions of 8 blocks take a turn each at once (both engines busy), all return
    from 60 s on with one more block."""
    rows = []
    for k in range(6):
        a = tuple(range(1000 * k + 1, 1000 * k + 9))
        rows += [(0.0, a), (60.0 + k, (*a, 1000 * k + 9))]
    reqs = tuple(
        TraceRequest(i, i + 1, t, len(h) * 512, 4, h) for i, (t, h) in enumerate(sorted(rows))
    )
    return Trace("t", "mooncake", reqs)


def _run(mode: str, at: float | None) -> Simulation:
    cfg = SimConfig(engines=2, kv_blocks=150, block_size=64, agent_memory=mode,
                    memory_budget_share=1.0, scale_in_at_s=at)  # fmt: skip
    sim = Simulation(cfg, _trace())
    run = sim.run()
    assert len(run.requests) == 12
    assert all(r.error is None and r.last is not None for r in run.requests)  # none lost
    return sim


@pytest.mark.parametrize(
    ("mode", "kept"), [("lru", 0.0), ("retention", 1.0), ("prefetch", 1.0)],
    ids=["lru-drops", "retention-migrates", "prefetch-migrates"],
)  # fmt: skip
def test_scale_in_removes_one_engine_and_keeps_its_sessions_kv(mode: str, kept: float) -> None:
    sim = _run(mode, 0.05)  # while the first turns run: the victim drains them first
    assert sum(i.removed for i in sim.engines) == 1
    (rec,) = sim.scale_ins
    assert sim.engines[rec.iid].removed and rec.removed_ms is not None
    assert rec.chosen_ms == 50.0 < rec.removed_ms < 60_000.0
    assert rec.sessions and rec.prefix_blocks == 64 * len(rec.sessions)  # 8 x 512 tokens
    assert rec.kept_ratio == kept
    assert rec.kept_unmigrated_blocks == 0  # all on the victim: what is kept, migration kept
    assert sim.memory is not None
    migrated = sum(n for k, n in sim.memory.counts.items() if k.startswith("migrate_"))
    assert migrated == (len(rec.sessions) if mode != "lru" else 0)
    # the router follows the moved KV: each moved session's next turn is served where it
    # was moved (the gateways learned it)
    moved = {sid: iid for sid, iid, _ in sim.memory.moved}
    assert set(moved) <= set(rec.sessions)
    for req in sim.order:
        ids = sim.arrivals[req.index][1].hash_ids
        if str(ids[0]) in moved and req.arrival >= rec.removed_ms:
            assert req.home == moved[str(ids[0])]


def test_no_scale_in_removes_nothing() -> None:
    sim = _run("retention", None)
    assert not sim.scale_ins and not any(i.removed for i in sim.engines)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"scale_in_at_s": -1.0}, "scale-in-at-s"),
        ({"scale_in_at_s": 1.0, "scale_in_count": 2}, "scale-in-count"),
        ({"scale_in_at_s": 1.0, "scale_in_count": 0}, "scale-in-count"),
        ({"scale_in_at_s": 1.0, "prefill": 1, "decode": 1}, "P/D"),
        ({"scale_in_at_s": 1.0, "scale_in_window_s": 0.0}, "window"),
        ({"kv_blocks": 8, "kv_running_blocks": 9}, "kv-running-blocks"),
    ],
    ids=["negative-time", "all-engines", "none", "pd", "window", "running-past-kv"],
)
def test_bad_config_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(SimConfigError, match=message):
        SimConfig(engines=2, **fields).validate()  # type: ignore[arg-type]


def _sessions_then_trickle() -> Trace:
    """Eight sessions of 8 trace blocks (4,096 tokens; half a 150-block engine each) take a
    turn every 20 s until 600 s, then go quiet; one-block requests every 30 s keep the run
    going until 1,500 s."""
    rows: list[tuple[float, tuple[int, ...]]] = []
    for k in range(8):
        a = tuple(range(1000 * k + 1, 1000 * k + 9))
        rows += [(20.0 * j + k, (*a, 1000 * k + 100 + j)) for j in range(30)]
    rows += [(600.0 + 30.0 * j, (900_000 + j,)) for j in range(30)]
    reqs = tuple(
        TraceRequest(i, i + 1, t, len(h) * 512, 4, h) for i, (t, h) in enumerate(sorted(rows))
    )
    return Trace("t", "mooncake", reqs)


def _autoscaled(floor: bool) -> list[float]:
    """Modelled seconds at which the planner chose each victim."""
    planner = (("session_kv_floor", floor), ("scale_down_window_s", 120.0), ("cooldown_s", 30.0))
    cfg = SimConfig(engines=4, kv_blocks=150, block_size=64, agent_memory="retention",
                    memory_budget_share=1.0, scale_in_window_s=60.0,
                    autoscale=AutoscaleConfig(min_replicas=1, max_replicas=4,
                                              planner=planner))  # fmt: skip
    sim = Simulation(cfg, _sessions_then_trickle())
    run = sim.run()
    assert all(r.error is None and r.last is not None for r in run.requests)  # none lost
    return [r.chosen_ms / 1000.0 for r in sim.scale_ins]


def test_planner_floor_holds_the_fleet_while_the_sessions_do_not_fit() -> None:
    """The sessions' 33 k tokens need 4 engines' KV x 0.9: with the floor the planner
    removes none while they are active (until 60 s after their last turns, about 600 s),
    and scales in once they have gone quiet; without it, it scales in among them."""
    with_floor = _autoscaled(True)
    assert with_floor and min(with_floor) > 640.0
    without = _autoscaled(False)
    assert without and min(without) < 600.0


def test_agent_memory_measures_the_planner_chosen_scale_in() -> None:
    """``agent_memory.py``'s planner section on the small trace: nothing lost, the floor's
    and the no-floor run's figures side by side, the floor removing later (fewer follow-ups)."""
    from benchmarks._agent_memory_planner import measure

    cfg = SimConfig(engines=4, kv_blocks=150, block_size=64, agent_memory="retention",
                    memory_budget_share=1.0, scale_in_window_s=60.0)  # fmt: skip
    got = measure(cfg, _sessions_then_trickle())
    assert got["scale_in_planner.lost"] == got["scale_in_planner_no_floor.lost"] == 0.0
    assert (got["scale_in_planner.removed"] or 0) >= 1
    assert (got["scale_in_planner_no_floor.followups"] or 0) > (
        got["scale_in_planner.followups"] or 0
    )
