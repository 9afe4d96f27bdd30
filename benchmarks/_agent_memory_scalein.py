"""The scale-in measurement of ``agent_memory.py``: one engine of the fleet removed mid-run
by the simulator's explicit scale-in (:mod:`services.sim.scalein`: the autoscaler's victim
rule, drain, then migrate in the offload modes or drop under LRU), against the same run
without it.

Per variant and slice (see ``agent_memory.py``'s docstring for the definitions):
``scale_in.lost``, ``scale_in.kept_ratio``, ``scale_in.ttft_p95_vs_no_scale_in``, and what
explains them: the first follow-up turn's ratio, the active sessions and follow-up turns
counted, the drain time, the fleet's KV use.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from benchmarks._agentic_slice import p95
from services.common.bench.traces import Trace
from services.sim.config import SimConfig
from services.sim.run import SimRun, Simulation

__all__ = ["measure", "p95_ratio", "removal_s", "ttft_by_index"]


def removal_s(cfg: SimConfig, trace: Trace, share: float) -> float:
    """The modelled second of the arrival ``share`` of the way through the slice."""
    reqs = sorted(r.arrival_s for r in trace.requests)
    return reqs[min(len(reqs) - 1, int(share * len(reqs)))] / cfg.time_divisor


def _run(cfg: SimConfig, trace: Trace) -> tuple[Simulation, SimRun]:
    t0 = time.monotonic()
    sim = Simulation(cfg, trace)
    run = sim.run()
    print(f"{cfg.agent_memory} x{cfg.engines} scale_in={cfg.scale_in_at_s}: "
          f"{len(run.requests)} requests, {time.monotonic() - t0:.1f} s", file=sys.stderr)  # fmt: skip
    return sim, run


def ttft_by_index(run: SimRun) -> dict[int, float]:
    """Each served request's TTFT (modelled ms), by its index in the trace."""
    return {
        r.index: r.first - r.arrival
        for r in run.requests
        if r.first is not None and r.error is None
    }


def p95_ratio(a: list[float], b: list[float]) -> float | None:
    """p95 of ``a`` over p95 of ``b`` (None when either is empty or ``b``'s is 0)."""
    return p95(a) / p95(b) if a and b and p95(b) > 0 else None


def _ok(run: SimRun) -> set[int]:
    return {r.index for r in run.requests if r.error is None and r.last is not None}


def measure(cfg: SimConfig, trace: Trace, at_s: list[float]) -> list[dict[str, float | None]]:
    """``cfg`` (an agent-memory mode, no scale-in) run without a scale-in and, per time in
    ``at_s``, with one engine removed then: the ``scale_in.*`` figures of each."""
    _, base = _run(cfg, trace)
    return [_one(cfg, trace, at, base) for at in at_s]


def _one(cfg: SimConfig, trace: Trace, at: float, base: SimRun) -> dict[str, float | None]:
    sim, run = _run(replace(cfg, scale_in_at_s=at, scale_in_count=1), trace)
    recs = [r for r in sim.scale_ins if r.removed_ms is not None]
    prefix = sum(r.prefix_blocks for r in recs)
    kept = sum(r.kept_blocks for r in recs)
    unmigrated = sum(r.kept_unmigrated_blocks for r in recs)
    # the removed engine's active sessions' turns arriving after its removal
    gone = {s: r.removed_ms for r in recs for s in r.sessions}
    follow: list[int] = []
    first: dict[str, int] = {}
    for req in run.requests:
        ids = sim.arrivals[req.index][1].hash_ids
        s = str(ids[0]) if ids else ""  # the simulator's session id
        t = gone.get(s)
        if t is not None and req.arrival >= t:
            follow.append(req.index)
            first.setdefault(s, req.index)
    a, b = ttft_by_index(run), ttft_by_index(base)
    both = [i for i in follow if i in a and i in b]
    firsts = [i for i in first.values() if i in a and i in b]
    mem = sim.memory.summary() if sim.memory is not None else {}
    return {
        # served without the scale-in, failed or never finished with it
        "scale_in.lost": float(len(_ok(base) - _ok(run))),
        "scale_in.failed": float(len(sim.arrivals) - len(_ok(run))),
        "scale_in.kept_ratio": kept / prefix if prefix else None,
        "scale_in.kept_unmigrated_ratio": unmigrated / prefix if prefix else None,
        "scale_in.ttft_p95_vs_no_scale_in": p95_ratio([a[i] for i in both], [b[i] for i in both]),
        "scale_in.first_followup_ttft_p95_vs_no_scale_in": p95_ratio(
            [a[i] for i in firsts], [b[i] for i in firsts]
        ),
        "scale_in.ttft_p95_ms": p95([a[i] for i in both]) if both else None,
        "scale_in.no_scale_in_ttft_p95_ms": p95([b[i] for i in both]) if both else None,
        "scale_in.sessions": float(len(gone)),
        "scale_in.prefix_tokens": float(prefix * cfg.block_size),
        "scale_in.followups": float(len(both)),
        "scale_in.drain_s": sum((r.removed_ms or 0.0) - r.chosen_ms for r in recs) / 1000.0,
        "scale_in.fleet_kv_used": mem.get("fleet_kv_used"),
    }
