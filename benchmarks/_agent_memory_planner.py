"""The planner-chosen scale-in of ``agent_memory.py``: the simulator's SLA planner
(:mod:`services.sim.autoscale`) sizes the fleet on an agentic slice whose load falls, and
removes engines when *it* decides, by the product's path (the victim rule, drain, then
migrate in the offload modes or drop under LRU), against the same run with scale-in
forbidden (min replicas = the fleet's size).

Per variant, slice and seed, three runs of the same fleet and planner:

- ``floor``: the planner with its scale-in floor from the active sessions' KV
  (``session_kv_floor``, the default; :mod:`services.common.planner.sessionkv`);
- ``no_floor``: the same planner with the floor off (how it sized the fleet before);
- ``fixed``: min replicas = max replicas = the fleet: no scale-in.

Keys, ``scale_in_planner.*`` for ``floor`` and ``scale_in_planner_no_floor.*``:
``ttft_p95_vs_no_scale_in`` (p95 TTFT of every removed engine's active sessions' turns
arriving after its removal, over the same turns' p95 in ``fixed``; None when the planner
removed no engine with an active session), ``all_ttft_p95_vs_no_scale_in`` (every turn
arriving after the first removal, same comparison), ``lost`` (served in ``fixed``, failed
or unfinished here), ``kept_ratio`` (of the removed engines' active sessions' prefix blocks,
the share still cached right after each removal), ``removed`` (engines removed by the
planner), ``sessions`` and ``followups`` (what the ratio is over), ``engine_s_vs_no_scale_in``
(engine-seconds over the run, from the timeline's replicas per window, over ``fixed``'s).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from _agent_memory_scalein import p95_ratio, ttft_by_index

from services.common.bench.traces import Trace
from services.sim.autoscale import AutoscaleConfig
from services.sim.config import SimConfig
from services.sim.run import SimRun, Simulation

__all__ = ["measure"]


def _run(cfg: SimConfig, trace: Trace, label: str) -> tuple[Simulation, SimRun]:
    t0 = time.process_time()
    sim = Simulation(cfg, trace)
    run = sim.run()
    print(f"planner {label} {cfg.agent_memory} seed={cfg.seed}: {len(run.requests)} requests, "
          f"{time.process_time() - t0:.1f} CPU-s", file=sys.stderr)  # fmt: skip
    return sim, run


def _ok(run: SimRun) -> set[int]:
    return {r.index for r in run.requests if r.error is None and r.last is not None}


def _engine_s(sim: Simulation) -> float:
    rows = sim.timeline.rows
    return sum(float(r["replicas_worker"]) for r in rows) * sim.cfg.timeline_s


def autoscaled(cfg: SimConfig, floor: bool, min_replicas: int) -> SimConfig:
    """``cfg`` with the SLA planner between ``min_replicas`` and the fleet's size."""
    a = AutoscaleConfig(
        min_replicas=min_replicas,
        max_replicas=cfg.engines,
        planner=(("session_kv_floor", floor),),
    )
    return replace(cfg, autoscale=a)


def measure(cfg: SimConfig, trace: Trace) -> dict[str, float | None]:
    """``cfg`` (an agent-memory mode, a fixed fleet) under the planner, with and without
    the floor, against scale-in forbidden: the keys of the module doc."""
    fixed_sim, fixed = _run(autoscaled(cfg, True, cfg.engines), trace, "fixed")
    out: dict[str, float | None] = {}
    for floor, prefix in ((True, "scale_in_planner"), (False, "scale_in_planner_no_floor")):
        sim, run = _run(autoscaled(cfg, floor, 1), trace, prefix)
        for k, v in _figures(sim, run, fixed, _engine_s(fixed_sim)).items():
            out[f"{prefix}.{k}"] = v
    return out


def _figures(
    sim: Simulation, run: SimRun, fixed: SimRun, fixed_engine_s: float
) -> dict[str, float | None]:
    recs = [r for r in sim.scale_ins if r.removed_ms is not None]
    gone: dict[str, float] = {}  # a session's first removal (it may be moved again)
    for r in sorted(recs, key=lambda r: r.removed_ms or 0.0):
        for s in r.sessions:
            gone.setdefault(s, r.removed_ms or 0.0)
    follow = []
    for req in run.requests:
        ids = sim.arrivals[req.index][1].hash_ids
        t = gone.get(str(ids[0]) if ids else "")
        if t is not None and req.arrival >= t:
            follow.append(req.index)
    a, b = ttft_by_index(run), ttft_by_index(fixed)
    both = [i for i in follow if i in a and i in b]
    first = min((r.removed_ms for r in recs if r.removed_ms is not None), default=None)
    after = [
        r.index
        for r in run.requests
        if first is not None and r.arrival >= first and r.index in a and r.index in b
    ]
    prefix = sum(r.prefix_blocks for r in recs)
    return {
        "ttft_p95_vs_no_scale_in": p95_ratio([a[i] for i in both], [b[i] for i in both]),
        "all_ttft_p95_vs_no_scale_in": p95_ratio([a[i] for i in after], [b[i] for i in after]),
        "lost": float(len(_ok(fixed) - _ok(run))),
        "kept_ratio": sum(r.kept_blocks for r in recs) / prefix if prefix else None,
        "removed": float(len(recs)),
        "sessions": float(len(gone)),
        "followups": float(len(both)),
        "engine_s_vs_no_scale_in": _engine_s(sim) / fixed_engine_s if fixed_engine_s else None,
    }
