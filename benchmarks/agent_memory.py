"""Agent memory in simulation: does a session's KV survive its tool calls? Prints JSON.

Replays slices of the WEKA agentic trace (Claude Code sessions) through ``tideserve sim``'s
simulator (:mod:`services.sim`; agent memory: :mod:`services.sim.memory`) with the think
and tool gaps restored (the trace is compressed 10x: arrivals are trace time x 10), on a
fleet whose KV is small enough that the sessions do not all fit. Variants, each on a fresh
fleet with the same routing profile:

- ``lru``: today's behaviour (the engines' LRU, no tier);
- ``retention``: the retention controller's plan applied every second (idle sessions
  protected within the budget, the rest offloaded to the tier; evictions go to the tier),
  a resumed turn fetching its offloaded prefix at arrival when that beats recomputing;
- ``retention_prefetch``: ``retention`` plus prefetch before the predicted return;
- ``retention_prefetch_rebalance``: all of them together: ``retention_prefetch`` plus
  hot-spot rebalancing (``SimConfig.memory_rebalance``,
  :func:`~services.common.sessions.rebalance.plan_rebalance`): each round, idle sessions
  leave an engine holding most of the active sessions' KV for the one holding least;
- ``warm`` (reference, not a variant): ``lru`` with 64x the KV to cache in (nothing
  evicted) but the same KV for running requests (``SimConfig.kv_running_blocks``), so its
  batches are those of the other runs and only what stays cached differs.

``--memory-offload eager`` runs the retention variants with the earlier rule (every idle
session past the budget offloaded at once, even with free room) instead of ``pressure``
(kept on the GPU while it has room).

Keys per variant, each as ``{"mean", "spread", "slices"}`` over the slices (spread = max -
min): ``resume.reuse_ratio`` (of a resumed turn's reusable prefix blocks, the share still on
its engine's GPU or on the tier when it arrived), ``resume.ttft_p95_vs_warm`` (p95 TTFT of
the resumed turns over the same turns' p95 in the ``warm`` run;
``resume.ttft_p95_vs_warm_more_batch``: over a warm run whose 64x KV also holds 64x the
running requests, so its batches grow too), ``idle_kv_share`` (mean share of GPU KV held by
idle sessions' blocks, evictable cache included), ``idle_kv_share_protected`` (of it, the
blocks protected: evicted last, what running requests cannot take first; the budget bounds
it), ``protected_kv_share`` (every protected block, the chains held for turns that have
arrived included), ``fleet_kv_used`` (mean share of the
fleet's KV in use, the ">= 90% used" condition).

P/D (``--pd-engines`` N, default 8; 0 skips it): per variant and slice (the slices above),
the aggregated fleet of N engines of ``--pd-kv-blocks`` against every split P + (N - P) in
``--pd-splits`` (prefill engines; default all, 1 .. N-1), each with the variant's agent
memory (on P/D: applied to the prefill and the decode engines, a session's home being its
decode engine), P/D with ``decode_keeps_kv``, every fleet with ``--pd-short-first-tokens``
(:mod:`benchmarks._agent_memory_pd`). ``pd.best_split_ttft_vs_aggregated``: the lowest mean
TTFT of the splits over the aggregated fleet's; ``pd.best_split_prefill``: which split won.
``--pd-decode`` (default ``split,local``): ``split`` measures decode engines that cannot
compute a prompt (SGLang's in disaggregation mode: every turn is disaggregated; ``pd.*``),
``local`` decode engines that can (vLLM's, Dynamo's: the routing profile's ``pd-decider``
leaves a turn with a short uncached suffix on its decode engine; ``pd_local.*``).
All 7 splits of 8 on 3 slices x 3 variants is 72 runs per kind of decode engine, 144 with
both, about 12 minutes on 2 busy shared cores (``--pd-splits 2,3,4`` or ``--pd-decode local``
cut that).

Scale-in (``--scale-in-engines``, default 8; 0 skips it), on a larger slice
(``--scale-in-slices``, ``--scale-in-requests``) and ``--scale-in-kv-blocks`` per engine: per
variant, a run without scale-in and, per removal time in ``--scale-in-at`` (shares of the
way through the slice's arrivals), a run where the simulator's explicit scale-in
(:mod:`services.sim.scalein`) removes one engine then: the autoscaler's victim rule picks it
(load, then session KV), it drains, then its sessions are migrated (``retention``,
``retention_prefetch``: to the tier, re-homed) or its KV dropped (``lru``). Each removal
time is one sample (``slices`` lists them, slice by slice). The removed engine's *active
sessions*: those homed there when it leaves, not ended, with a turn in flight, a turn that
ended within ``--scale-in-window-s`` modelled seconds before, or a predicted return after.
Keys: ``scale_in.lost`` (requests served in the run without scale-in that failed or never
finished with it; ``scale_in.failed`` counts every failure, e.g. a prompt past the context
limit), ``scale_in.kept_ratio`` (of those sessions' prefix blocks, each one's last turn's
chain, the share a next turn could still reuse right after the removal: on a remaining
engine's GPU then the tier; ``scale_in.kept_unmigrated_ratio``: the share already there
before the migration), ``scale_in.ttft_p95_vs_no_scale_in`` (p95 TTFT of those sessions'
turns arriving after the removal over the same turns' p95 without scale-in;
``scale_in.first_followup_...``: each session's first such turn only), and what explains
them (sessions, follow-up turns, drain seconds, fleet KV used).

Planner-chosen scale-in (``--planner-slices``, default ``0:20,20:40,40:59,0:30,30:59,0:59``,
each its first ``--planner-requests``; ``--planner-seeds``, which change nothing with the
default routing profile, whose picks are not random; fleet: ``--scale-in-engines`` of
``--scale-in-kv-blocks``; :mod:`benchmarks._agent_memory_planner`): the simulator's SLA
planner (TTFT p90 target 2 s) sizes the fleet between 1 and its size, the load falling over
each slice, and removes engines when it decides; per variant, with its scale-in floor from
the active sessions' KV (``scale_in_planner.*``) and without (``scale_in_planner_no_floor.*``),
against the same run with scale-in forbidden (min replicas = the fleet's size):
``ttft_p95_vs_no_scale_in`` (the removed engines' active sessions' turns after their
removal), ``all_ttft_p95_vs_no_scale_in`` (every turn after the first removal), ``lost``,
``kept_ratio``, ``removed``, ``engine_s_vs_no_scale_in``. One sample per slice and seed.
``--sections`` picks what runs (default ``resume,scale_in,planner,pd``), ``--variants`` which
variants (default all).

``--tier-restart`` also measures, live (the real Transfer Engine; needs its wheel and
libibverbs), a ``kvcache`` instance with a disk segment killed with SIGKILL and started
again (``benchmarks/kvcache_disk_restart.py`` with its defaults): ``tier_restart_s`` = from
the new process's spawn until every block it held is fetched again through kvmeta, verified;
``tier_restart`` = that script's whole JSON (both variants, the put cost).

    .venv/bin/python benchmarks/agent_memory.py  # 3 slices x 300 requests, 2 engines x 2300 blocks
    # + scale-in: sessions 0:59, 1000 requests, 8 engines x 2300 blocks, removed at 1/3, 1/2, 2/3
    # + P/D: the same slices, 8 aggregated engines x 2300 blocks vs 1P+7D .. 7P+1D
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _agent_memory_pd
from benchmarks._agent_memory_planner import measure as measure_planner
from benchmarks._agent_memory_scalein import measure, removal_s
from benchmarks._agentic_slice import p95, parse_slice, slice_trace
from benchmarks._harness import TRACES, command_line, emit_json, machine
from services.common.bench.traces import Trace, load_trace
from services.sim.config import SimConfig
from services.sim.run import Simulation

TRACE = TRACES / "weka_agentic_dev.jsonl"
# variant -> the SimConfig fields that make it
VARIANTS: dict[str, dict[str, Any]] = {
    "lru": {"agent_memory": "lru"},
    "retention": {"agent_memory": "retention"},
    "retention_prefetch": {"agent_memory": "prefetch"},
    "retention_prefetch_rebalance": {"agent_memory": "prefetch", "memory_rebalance": True},
}


def _variants(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    chosen = args.variants.split(",")
    return [(name, mode) for name, mode in VARIANTS.items() if name in chosen]


def run_one(cfg: SimConfig, trace: Trace) -> tuple[dict[str, Any], dict[int, float]]:
    t0 = time.monotonic()
    sim = Simulation(cfg, trace)
    run = sim.run()
    print(f"{cfg.agent_memory} kv={cfg.kv_blocks}: {len(run.requests)} requests, "
          f"{time.monotonic() - t0:.1f} s", file=sys.stderr)  # fmt: skip
    assert sim.memory is not None
    ttft = {
        r.index: r.first - r.arrival
        for r in run.requests
        if r.first is not None and r.error is None
    }
    out = sim.memory.summary()
    out["failed"] = sum(1 for r in run.requests if r.error is not None)
    out["resumed"] = [x.index for x in sim.memory.resumes]
    return out, ttft


def stat(xs: list[float | None]) -> dict[str, Any]:
    vals = [x for x in xs if x is not None]
    if not vals:
        return {"mean": None, "spread": None, "slices": xs}
    return {
        "mean": round(sum(vals) / len(vals), 4),
        "spread": round(max(vals) - min(vals), 4),
        "slices": [round(x, 4) if x is not None else None for x in xs],
    }


def tier_restart() -> dict[str, Any]:
    """``tier_restart_s`` and the whole JSON of ``kvcache_disk_restart.py`` (its defaults)."""
    from benchmarks import kvcache_disk_restart as kdr

    restart = asyncio.run(kdr.run(kdr.parser().parse_args([])))
    rest = {k: v for k, v in restart.items() if k not in ("command", "machine")}
    return {"tier_restart_s": restart["tier_restart_s"], "tier_restart": rest}


def scale_in(
    args: argparse.Namespace, trace: Trace, base: SimConfig, per: dict[str, dict[str, Any]]
) -> None:
    """The ``scale_in.*`` keys: per scale-in slice and removal time (one sample each)."""
    shares = [float(x) for x in args.scale_in_at.split(",")]
    for a, b in (parse_slice(s) for s in args.scale_in_slices.split(",")):
        tr = slice_trace(trace, a, b, args.scale_in_requests)
        for name, mode in _variants(args):
            cfg = replace(base, **mode, engines=args.scale_in_engines,
                          kv_blocks=args.scale_in_kv_blocks,
                          scale_in_window_s=args.scale_in_window_s)  # fmt: skip
            for got in measure(cfg, tr, [removal_s(cfg, tr, x) for x in shares]):
                for k, v in got.items():
                    per[name].setdefault(k, []).append(v)


def planner_scale_in(
    args: argparse.Namespace, trace: Trace, base: SimConfig, per: dict[str, dict[str, Any]]
) -> None:
    """The ``scale_in_planner*`` keys: per planner slice and seed (one sample each)."""
    seeds = [int(x) for x in args.planner_seeds.split(",")]
    for a, b in (parse_slice(s) for s in args.planner_slices.split(",")):
        tr = slice_trace(trace, a, b, args.planner_requests)
        for name, mode in _variants(args):
            for seed in seeds:
                cfg = replace(base, **mode, engines=args.scale_in_engines,
                              kv_blocks=args.scale_in_kv_blocks, seed=seed,
                              scale_in_window_s=args.scale_in_window_s)  # fmt: skip
                for k, v in measure_planner(cfg, tr).items():
                    per[name].setdefault(k, []).append(v)


def pd(
    args: argparse.Namespace, trace: Trace, base: SimConfig, per: dict[str, dict[str, Any]]
) -> None:
    """The ``pd.*`` keys: per slice, the aggregated fleet against the P/D splits."""
    splits = [int(x) for x in args.pd_splits.split(",")] if args.pd_splits else []
    splits = splits or list(range(1, args.pd_engines))
    modes = args.pd_decode.split(",")
    for a, b in (parse_slice(s) for s in args.slices.split(",")):
        tr = slice_trace(trace, a, b, args.max_requests)
        for name, mode in _variants(args):
            cfg = replace(base, **mode, kv_blocks=args.pd_kv_blocks,
                          short_first_tokens=args.pd_short_first_tokens)  # fmt: skip
            for local in (m == "local" for m in modes):
                got = _agent_memory_pd.measure(cfg, tr, args.pd_engines, splits, local)
                for k, v in got.items():
                    per[name].setdefault(k, []).append(v)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument(
        "--slices", default="0:20,20:40,40:59", help="session ranges A:B, comma-separated"
    )
    p.add_argument("--max-requests", type=int, default=300, help="first N requests per slice")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--kv-blocks", type=int, default=2300, help="per engine (64-token blocks)")
    p.add_argument("--gap-scale", type=float, default=10.0, help="trace gaps x this (10 restores)")
    p.add_argument("--budget-share", type=float, default=0.2)
    p.add_argument("--memory-offload", choices=("pressure", "eager"), default="pressure",
                   help="idle sessions past the budget: kept while there is room, or eager")  # fmt: skip
    p.add_argument("--profile", default="default", help="routing profile of every variant")
    p.add_argument("--profiles-file", default=None, help="routing profiles YAML (default: shipped)")
    p.add_argument("--scale-in-engines", type=int, default=8, help="0: no scale-in measurement")
    p.add_argument("--scale-in-kv-blocks", type=int, default=2300, help="per engine")
    p.add_argument("--scale-in-slices", default="0:59", help="session ranges, comma-separated")
    p.add_argument("--scale-in-requests", type=int, default=1000, help="first N per slice")
    p.add_argument("--scale-in-at", default="0.33,0.5,0.67",
                   help="removal times: shares of the way through the slice's arrivals")  # fmt: skip
    p.add_argument("--scale-in-window-s", type=float, default=300.0,
                   help="active session: a turn ended within this many modelled seconds")  # fmt: skip
    p.add_argument("--planner-slices", default="0:20,20:40,40:59,0:30,30:59,0:59",
                   help="planner-chosen scale-in: session ranges, comma-separated")  # fmt: skip
    p.add_argument("--planner-requests", type=int, default=1000, help="first N per slice")
    p.add_argument("--planner-seeds", default="0", help="simulator seeds, comma-separated")
    p.add_argument("--sections", default="resume,scale_in,planner,pd",
                   help="what to measure: resume, scale_in, planner, pd (comma-separated)")  # fmt: skip
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma list of {', '.join(VARIANTS)} (default all)")  # fmt: skip
    p.add_argument("--pd-engines", type=int, default=8, help="0: no P/D measurement")
    p.add_argument("--pd-kv-blocks", type=int, default=2300, help="per engine")
    p.add_argument("--pd-splits", default="", help="prefill engines per split (default: all)")
    p.add_argument("--pd-decode", default="split,local",
                   help="P/D decode engines: split (cannot compute prompts, pd.*), local (can: "
                   "short suffixes stay on them, pd_local.*); comma-separated")  # fmt: skip
    p.add_argument("--pd-short-first-tokens", type=int, default=16384,
                   help="every P/D and aggregated fleet's short_first_tokens")  # fmt: skip
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument(
        "--tier-restart", action="store_true", help="also measure tier_restart_s (live, ~1 min)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        print(f"unknown variants: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    trace = load_trace(args.trace)
    base = SimConfig(
        engines=args.engines,
        kv_blocks=args.kv_blocks,
        rate_scale=1.0 / args.gap_scale,
        profile=args.profile,
        profiles_file=args.profiles_file,
        memory_budget_share=args.budget_share,
        memory_offload=args.memory_offload,
    )
    t0 = time.monotonic()
    per: dict[str, dict[str, list[float | None]]] = {v: {} for v, _ in _variants(args)}
    sections = set(args.sections.split(","))
    slices = [parse_slice(s) for s in args.slices.split(",")] if "resume" in sections else []
    for a, b in slices:
        tr = slice_trace(trace, a, b, args.max_requests)
        # warm: 64x the KV to cache in, the same KV for running requests (the same batches)
        big = replace(base, agent_memory="lru", kv_blocks=args.kv_blocks * 64)
        _, warm = run_one(replace(big, kv_running_blocks=args.kv_blocks), tr)
        _, warm_batch = run_one(big, tr)
        for name, mode in _variants(args):
            got, ttft = run_one(replace(base, **mode), tr)
            both = [i for i in got["resumed"] if i in ttft and i in warm]
            vs = p95([ttft[i] for i in both]) / p95([warm[i] for i in both]) if both else None
            bb = [i for i in both if i in warm_batch]
            vs_batch = p95([ttft[i] for i in bb]) / p95([warm_batch[i] for i in bb]) if bb else None
            row = per[name]
            for k, v in (
                ("resume.reuse_ratio", got["reuse_ratio"]),
                ("resume.ttft_p95_vs_warm", vs),
                ("resume.ttft_p95_vs_warm_more_batch", vs_batch),
                ("resume.ttft_p95_ms", p95([ttft[i] for i in both]) if both else None),
                ("idle_kv_share", got["idle_kv_share"]),
                ("idle_kv_share_protected", got["idle_kv_share_protected"]),
                ("protected_kv_share", got["protected_kv_share"]),
                ("fleet_kv_used", got["fleet_kv_used"]),
                ("failed", float(got["failed"])),
                ("resumed_turns", float(got["resumed_turns"])),
            ):
                row.setdefault(k, []).append(v)
    if args.scale_in_engines and "scale_in" in sections:
        scale_in(args, trace, base, per)
    if args.scale_in_engines and "planner" in sections:
        planner_scale_in(args, trace, base, per)
    if args.pd_engines > 1 and "pd" in sections:
        pd(args, trace, base, per)
    out = {
        "benchmark": "agent_memory",
        "command": command_line(),
        "machine": machine(),
        "trace": Path(args.trace).name,
        "slices": args.slices,
        "max_requests": args.max_requests,
        "engines": args.engines,
        "kv_blocks": args.kv_blocks,
        "gap_scale": args.gap_scale,
        "budget_share": args.budget_share,
        "memory_offload": args.memory_offload,
        "profile": args.profile,
        "scale_in": {
            "engines": args.scale_in_engines,
            "kv_blocks": args.scale_in_kv_blocks,
            "slices": args.scale_in_slices,
            "max_requests": args.scale_in_requests,
            "at": args.scale_in_at,
            "window_s": args.scale_in_window_s,
        },
        "scale_in_planner": {
            "slices": args.planner_slices,
            "max_requests": args.planner_requests,
            "seeds": args.planner_seeds,
            "ttft_p90_target_ms": 2000.0,
            "min_replicas": 1,
        },
        "sections": args.sections,
        "pd": {
            "engines": args.pd_engines,
            "kv_blocks": args.pd_kv_blocks,
            "splits": args.pd_splits or "all",
            "short_first_tokens": args.pd_short_first_tokens,
            "decode_keeps_kv": True,
            "decode": args.pd_decode,
        },
        "variants": {v: {k: stat(xs) for k, xs in row.items()} for v, row in per.items()},
        "wall_s": round(time.monotonic() - t0, 1),
    }
    if args.tier_restart:
        out.update(tier_restart())
    emit_json(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
