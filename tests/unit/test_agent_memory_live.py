"""benchmarks/agent_memory_live.py's pure parts: which turns are resumed and what they could
reuse, each variant's stack configuration, and the figures from per-request records."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from services.common.bench.traces import TraceRequest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def live() -> ModuleType:
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    return importlib.import_module("agent_memory_live")


def req(i: int, ids: list[int], n: int) -> TraceRequest:
    return TraceRequest(index=i, line=i + 1, arrival_s=float(i), input_length=n,
                        output_length=8, hash_ids=tuple(ids))  # fmt: skip


@pytest.mark.parametrize(
    ("reqs", "want"),
    [
        ([req(0, [1, 2], 1000)], {}),
        ([req(0, [1, 2], 1000), req(1, [1, 2, 3], 1500)], {1: 1000}),
        ([req(0, [1, 2, 3], 1500), req(1, [1, 2, 4], 1500)], {1: 1024}),
        ([req(0, [1, 2], 1000), req(1, [5, 6], 900), req(2, [1, 2, 7], 1400)], {2: 1000}),
        ([req(0, [1, 2], 1000), req(1, [1, 2, 3], 1500), req(2, [1, 2, 3, 4], 2000)],
         {1: 1000, 2: 1500}),
    ],
    ids=["first-turn", "grown", "diverged", "interleaved", "three-turns"],
)  # fmt: skip
def test_resumed_turns_and_their_reusable_tokens(
    reqs: list[TraceRequest], want: dict[int, int]
) -> None:
    assert live().resumed_turns(reqs) == want


@pytest.mark.parametrize(
    ("variant", "retention", "prefetch", "tier", "kv_blocks", "running"),
    [
        ("warm", "off", False, False, 2300 * 64, "2300"),
        ("lru", "off", False, False, 2300, None),
        ("retention", "enforce", False, True, 2300, None),
        ("retention_prefetch", "enforce", True, True, 2300, None),
        ("sglang_cache_aware", "off", False, False, 2300, None),
    ],
    ids=["warm", "lru", "retention", "retention-prefetch", "sglang"],
)  # fmt: skip
def test_each_variant_configures_its_stack(
    variant: str, retention: str, prefetch: bool, tier: bool, kv_blocks: int, running: str | None
) -> None:
    m = live()
    cfg: dict[str, Any] = json.loads(m.config_yaml(m.parse_args([]), variant))
    args = cfg["stack"]["engine_args"]
    assert cfg["kvmeta"]["retention"] == retention
    assert cfg["kvmeta"]["retention_prefetch"] is prefetch
    assert ("--kvcache-tier" in args) is tier
    assert cfg["stack"]["engine_kv_blocks"] == kv_blocks
    got = args[args.index("--kv-running-blocks") + 1] if "--kv-running-blocks" in args else None
    assert got == running
    assert cfg["scheduler"]["agent_sessions"] is True


def test_figures_compare_the_same_turns_with_the_warm_run() -> None:
    def run(ttfts: list[float | None], cached: list[int]) -> dict[str, Any]:
        recs = [{"index": i, "ttft_ms": t, "error": None if t is not None else "x",
                 "cached_tokens": c} for i, (t, c) in enumerate(zip(ttfts, cached, strict=True))]  # fmt: skip
        return {"records": recs, "summary": {}, "fleet_kv_used": 0.95,
                "protected_kv_share": 0.1, "kvmeta": {}}  # fmt: skip

    warm = run([100.0, 10.0, 20.0, 40.0], [0, 500, 500, 500])
    mine = run([300.0, 30.0, None, 60.0], [0, 250, 0, 800])
    got = live().resume_figures(mine, warm, {1: 500, 2: 500, 3: 500})
    # turn 2 failed here: turns 1 and 3 are compared; cached counts at most the reusable
    assert got["resumed_turns"] == 2
    assert got["resume.reuse_ratio"] == pytest.approx((250 + 500) / 1000)
    assert got["resume.ttft_p95_vs_warm"] == pytest.approx(60.0 / 40.0)
    assert got["failed"] == 1
