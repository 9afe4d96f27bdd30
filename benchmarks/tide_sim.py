"""The SLA planner against the tide with the router and the engines in the loop. Prints JSON.

``autoscaler_eval.py`` scores the planner on a fleet model (a pooled prefill queue, a decode
batch at Little's-law equilibrium). This runs the same comparison in ``tideserve sim``: every
request routed by the scheduler's plugins to simulated engines with continuous batching and a
paged cache, the planner ticking on modelled time, instances starting ``--startup-s`` after
they are asked for and draining before removal.

Load: ServeGen's 14-day rate curve (``--curve``), the first ``--days`` of it, one day played
in ``--day-s`` modelled seconds, rates times ``--rate-scale``; each arrival the next request of
``--lengths`` (by default Azure's 2023 conversation trace, as ``autoscaler_eval.py``).
Policies, each on a fresh fleet and the same arrivals:

- ``static``: ``--static P,D`` prefill and decode instances (``--static N``: N aggregated
  engines), never scaled;
- ``planner``: starts at the same fleet and is scaled by the SLA planner (``--max-replicas``
  per role).

With ``--agent-memory MODES`` (a comma list of ``lru``, ``retention``, ``prefetch``) each
policy runs once per mode with the agent-memory tier in the loop (``tideserve sim
--agent-memory``): a scale-in migrates the victim's sessions to the tier (``lru``: their KV
is gone), a resumed turn finds its prefix on a GPU, on the tier or nowhere. Use it with a
lengths trace that has sessions, ``weka_agentic_dev.jsonl``; each run then reports
``agent_memory`` (the resumed turns' reuse) and ``scale_ins`` (the victims' active sessions'
prefix blocks kept).

Per policy, and per replayed day (``per_day``): SLO windows met (per ``--window-s`` of
modelled time, the requests that arrived in it meet both targets at ``--percentile``; a
window without requests is met), replica-seconds and their ratio to ``static``'s, peak
replicas, the bench's figures (the windows and replica-seconds are
:mod:`services.sim.policies`', as ``tideserve sim --autoscale-policy`` computes them; that
command also runs the autoscaler's reactive policy, and is the one-line way to the same
comparison).

    .venv/bin/python benchmarks/tide_sim.py --days 1 --out /tmp/tide_sim.json   # ~15 min

The planner's forecast runs on the load's clock (a day in ``--day-s``): its bucket and season
are the planner's defaults divided by the compression, and from the second day on it
forecasts the season. ``--tick-s``, ``--telemetry-window-s`` and ``--planner NAME=VALUE``
set the planner's own clock and settings.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._harness import TRACES, command_line, emit_json, machine
from services.common.bench.stats import RequestResult
from services.common.bench.traces import Trace, load_trace
from services.sim import SimConfig, simulate
from services.sim.autoscale import AutoscaleConfig
from services.sim.cli import planner_settings
from services.sim.curve import RateCurve, curve_trace, read_curve
from services.sim.policies import replica_seconds, slo_windows
from services.sim.results import request_results
from services.sim.run import SimRun

DAY_S = 86_400.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--curve", default=str(TRACES / "servegen_language_m-large_rate.csv"))
    p.add_argument("--lengths", default=str(TRACES / "azure2023_conv.csv"))
    p.add_argument("--days", type=float, default=1.0, help="days of the curve to replay")
    p.add_argument("--day-s", type=float, default=1200.0, help="modelled seconds per day")
    p.add_argument("--rate-scale", type=float, default=0.25, help="multiplies the curve's rates")
    p.add_argument("--static", default="8,3",
                   help="the static fleet and the planner's start: P,D or N (aggregated)")  # fmt: skip
    p.add_argument("--max-replicas", type=int, default=32, help="planner: per role")
    p.add_argument("--startup-s", type=float, default=10.0)
    p.add_argument("--tick-s", type=float, default=10.0, help="planner: seconds between ticks")
    p.add_argument("--telemetry-window-s", type=float, default=60.0,
                   help="planner: the telemetry window it sizes from")  # fmt: skip
    p.add_argument("--slo-ttft-ms", type=float, default=300.0)
    p.add_argument("--slo-tpot-ms", type=float, default=25.0)
    p.add_argument("--percentile", type=int, default=90, choices=(50, 90, 99))
    p.add_argument("--window-s", type=float, default=60.0, help="SLO window, modelled s")
    p.add_argument("--engine-profile", default="h200-llama3.1-8b")
    p.add_argument(
        "--stream-interval", type=int, default=16, help="engines' tokens per streamed chunk"
    )
    p.add_argument("--policies", default="static,planner")
    p.add_argument("--planner", action="append", default=[], metavar="NAME=VALUE",
                   help="planner: a setting of the autoscaler's planner config (repeatable)")  # fmt: skip
    p.add_argument("--agent-memory", default="",
                   help="comma list of lru, retention, prefetch: each policy once per mode")  # fmt: skip
    p.add_argument("--kv-blocks", type=int, default=16384, help="KV blocks per engine")
    p.add_argument("--memory-tier-mib", type=int, default=None,
                   help="the agent-memory tier's size (default: tideserve sim's)")  # fmt: skip
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def first_days(curve: RateCurve, days: float) -> RateCurve:
    end = days * DAY_S
    keep = [i for i, t in enumerate(curve.t_s) if t < end]
    return RateCurve(curve.path, tuple(curve.t_s[i] for i in keep),
                     tuple(curve.rate_rps[i] for i in keep))  # fmt: skip


def tide_trace(args: argparse.Namespace) -> Trace:
    curve = first_days(read_curve(args.curve), args.days)
    return curve_trace(curve, load_trace(args.lengths), rate_scale=args.rate_scale,
                       speedup=DAY_S / args.day_s, seed=args.seed)  # fmt: skip


def windows_met(results: list[RequestResult], args: argparse.Namespace, span_s: float) -> dict[str, Any]:  # fmt: skip
    """SLO windows by arrival: both targets at the percentile over the window's requests
    (a failed request misses both)."""
    w = slo_windows(results, window_s=args.window_s, span_s=span_s, ttft_ms=args.slo_ttft_ms,
                    tpot_ms=args.slo_tpot_ms, pct=float(args.percentile))  # fmt: skip
    return {"windows": w["windows"], "met": w["met"], "attainment": w["share"],
            "ttft_missed": w["ttft_missed"], "tpot_missed": w["tpot_missed"],
            "missed": w["missed"]}  # fmt: skip


def per_day(windows: dict[str, Any], rows: list[dict[str, Any]], timeline_s: float,
            day_s: float, window_s: float) -> list[dict[str, Any]]:  # fmt: skip
    """Each replayed day's SLO windows met and replica-seconds (a day from its first
    window; the run's last, partial day counts the windows it has)."""
    per = max(1, round(day_s / window_s))
    days = math.ceil(windows["windows"] / per)
    out = []
    for d in range(days):
        n = min(per, windows["windows"] - d * per)
        missed = sum(1 for w in windows["missed"] if d * per <= w < (d + 1) * per)
        mine = [r for r in rows if d * day_s <= float(r["t_s"]) < (d + 1) * day_s]
        out.append({"day": d + 1, "windows": n, "met": n - missed,
                    "replica_s": round(replica_seconds(mine, timeline_s), 1)})  # fmt: skip
    return out


def fleet(cfg: SimConfig, static: str) -> SimConfig:
    """``cfg`` with ``--static``'s fleet: ``P,D`` or ``N`` (aggregated)."""
    parts = [int(x) for x in static.split(",")]
    if len(parts) == 1:
        return replace(cfg, engines=parts[0])
    if len(parts) == 2:
        return replace(cfg, prefill=parts[0], decode=parts[1])
    raise SystemExit(f"--static takes P,D or N, got {static!r}")


def memory_summary(run: SimRun) -> dict[str, Any] | None:
    """The agent memory's figures of a run and what its scale-ins kept (None: off)."""
    if run.agent_memory is None:
        return None
    ins = run.scale_ins
    prefix = sum(r.prefix_blocks for r in ins)
    return {**run.agent_memory, "scale_ins": {
        "victims": len(ins),
        "active_sessions": sum(len(r.sessions) for r in ins),
        "prefix_blocks": prefix,
        "kept_ratio": round(sum(r.kept_blocks for r in ins) / prefix, 4) if prefix else None,
    }}  # fmt: skip


def run_policy(
    name: str, trace: Trace, args: argparse.Namespace, memory: str | None = None
) -> dict[str, Any]:
    cfg = fleet(SimConfig(engine_profile=args.engine_profile, seed=args.seed,
                          slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
                          stream_interval=args.stream_interval, kv_blocks=args.kv_blocks,
                          agent_memory=memory, memory_tier_mib=args.memory_tier_mib),
                args.static)  # fmt: skip
    if name == "planner":
        auto = AutoscaleConfig(tick_s=args.tick_s, window_s=args.telemetry_window_s,
                               max_replicas=args.max_replicas, startup_s=args.startup_s,
                               ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms,
                               percentile=float(args.percentile),
                               load_speedup=DAY_S / args.day_s,
                               planner=planner_settings(args.planner))  # fmt: skip
        cfg = replace(cfg, autoscale=auto)
    elif name != "static":
        raise SystemExit(f"unknown policy {name!r} (static, planner)")
    t0, cpu0 = time.perf_counter(), time.process_time()
    doc, run = simulate(cfg.validate(), trace)
    span_s = trace.requests[-1].arrival_s if trace.requests else 0.0
    replica_s = replica_seconds(run.timeline.rows, cfg.timeline_s)
    windows = windows_met(request_results(run), args, span_s)
    return {
        "slo_windows": windows,
        "per_day": per_day(windows, run.timeline.rows, cfg.timeline_s, args.day_s, args.window_s),
        "replica_s": round(replica_s, 1),
        "peak_replicas": doc["sim"]["autoscale"]["peak_replicas"] if doc["sim"]["autoscale"] else cfg.instances,
        "autoscale": doc["sim"]["autoscale"],
        "agent_memory": memory_summary(run),
        "completed": doc.get("completed"), "failed": doc.get("failed"),
        "ttft_ms": doc.get("ttft_ms"), "tpot_ms": doc.get("tpot_ms"),
        "slo_attainment": doc.get("slo_attainment"), "cache_hit_ratio": doc.get("cache_hit_ratio"),
        "wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(time.process_time() - cpu0, 1),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    trace = tide_trace(args)
    out: dict[str, Any] = {
        "benchmark": "tide_sim", "command": command_line(), "machine": machine(),
        "load": {"curve": args.curve, "lengths": args.lengths, "days": args.days,
                 "day_s": args.day_s, "rate_scale": args.rate_scale,
                 "requests": len(trace.requests)},
        "slo": {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms,
                "percentile": args.percentile, "window_s": args.window_s},
    }  # fmt: skip
    names = [x.strip() for x in args.policies.split(",") if x.strip()]
    modes = [x.strip() for x in args.agent_memory.split(",") if x.strip()]
    if not modes:
        out["policies"] = {name: run_policy(name, trace, args) for name in names}
        add_ratios(out["policies"])
    else:  # one table per agent-memory mode, each policy against that mode's static
        out["agent_memory"] = {}
        for mode in modes:
            runs = {name: run_policy(name, trace, args, mode) for name in names}
            add_ratios(runs)
            out["agent_memory"][mode] = runs
    emit_json(out, args.out)
    return 0


def add_ratios(policies: dict[str, dict[str, Any]]) -> None:
    """Each policy's replica-seconds against ``static``'s, in all and per day."""
    static = policies.get("static")
    for res in policies.values():
        res["replica_s_vs_static"] = (
            round(res["replica_s"] / static["replica_s"], 3)
            if static and static["replica_s"]
            else None
        )
        for mine, theirs in zip(res["per_day"], static["per_day"] if static else [], strict=False):
            if theirs["replica_s"]:
                mine["replica_s_vs_static"] = round(mine["replica_s"] / theirs["replica_s"], 3)


if __name__ == "__main__":
    sys.exit(main())
