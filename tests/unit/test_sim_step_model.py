"""The simulator's engine step model against a recording of the per-step model.

``tests/data/sim_step_model_golden.json`` holds the summaries the simulator produced when
it queued one event per engine step (every decode token), on the fixed trace and configs
below (seed 0). The batched model (decode-only stretches advanced in one event) must give
the same figures: counts, hit ratios and placements exactly, latency figures within
``REL_TOL`` (float sums taken in another order; the stretches' step times are the same
additions).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from services.common.bench.traces import Trace, parse_mooncake
from services.sim import SimConfig, SimRun, simulate

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "sim_step_model_golden.json"
REL_TOL = 1e-6  # latencies are rounded to the microsecond by the summary

# The recording predates the dispatch order's follower rule being on by default, gateway
# replicas sharing state and decode-tpot in the default profile: the cases keep the gateways
# it was recorded with (the rule off, nothing shared, the profile now `ttft-placement`),
# the step model is what is compared.
OLD = "ttft-placement"
CASES: list[tuple[str, SimConfig]] = [
    ("aggregated-scrape",
     SimConfig(engines=8, kv_blocks=4096, shaper_follow_ms=0.0, profile=OLD)),
    ("two-gateways-stream",
     SimConfig(engines=8, gateways=2, load_source="stream", kv_blocks=4096,
               shaper_follow_ms=0.0, share_state=False, profile=OLD)),
    ("pd-2-6", SimConfig(prefill=2, decode=6, kv_blocks=4096, shaper_follow_ms=0.0, profile=OLD)),
]  # fmt: skip


def trace(n: int = 600, seed: int = 7, gap_ms: int = 40) -> Trace:
    """Conversations sharing prefixes, 1-8k-token prompts, 20-400 output tokens, loaded
    enough that the engines batch tens of sequences and queue some."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        conv, blocks = rng.randrange(n // 3), rng.randrange(2, 16)
        lines.append(json.dumps({
            "timestamp": i * gap_ms, "input_length": blocks * 512 - rng.randrange(200),
            "output_length": rng.randrange(20, 400),
            "hash_ids": [conv * 100 + k for k in range(blocks)],
        }))  # fmt: skip
    return Trace("mem.jsonl", "mooncake", tuple(parse_mooncake(lines)))


def comparable(doc: dict[str, Any], run: SimRun) -> dict[str, Any]:
    """The figures of a run that do not depend on how many events the loop used: the
    summary's, and every request's first and last token times (ms, rounded to 1 us)."""
    sim = doc["sim"]
    return {
        "first_ms": [None if r.first is None else round(r.first, 3) for r in run.requests],
        "last_ms": [None if r.last is None else round(r.last, 3) for r in run.requests],
        **{k: doc[k] for k in ("completed", "failed", "cache_hit_ratio", "targets")},
        **{k: doc[k] for k in ("ttft_ms", "tpot_ms", "e2e_ms", "duration_s") if k in doc},
        "requests_per_instance": sim["requests_per_instance"],
        "routing": sim["routing"],
        "mean_held_ms": sim["mean_held_ms"],
    }


def assert_close(got: Any, want: Any, path: str = "") -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), path
        for k in want:
            assert_close(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, float) and not isinstance(want, bool):
        assert got == pytest.approx(want, rel=REL_TOL, abs=1e-3), path
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_close(g, w, f"{path}[{i}]")
    else:
        assert got == want, path


@pytest.mark.parametrize("cfg", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_the_step_model_gives_the_recorded_figures(
    cfg: SimConfig, request: pytest.FixtureRequest
) -> None:
    case_id = request.node.callspec.id
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))[case_id]
    doc, run = simulate(cfg, trace())
    assert_close(comparable(doc, run), want)
