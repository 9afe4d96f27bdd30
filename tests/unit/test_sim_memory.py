"""Agent memory in the simulator: on a fleet too small for every session, an idle session's
prefix survives its gap under retention (on the GPU or the tier) and not under LRU; the
measurements are those of the benchmark."""

from __future__ import annotations

import pytest

from services.bench.traces import Trace, TraceRequest
from services.sim.config import SimConfig, SimConfigError
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
