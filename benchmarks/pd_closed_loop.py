"""Does the closed loop find the P:D split on its own? Prints JSON.

In ``tideserve sim`` (virtual time, the product's router, engines' core and SLA planner):

1. **Sweep.** A steady load (a flat rate curve, ``--rate`` req/s for ``--duration-s``
   modelled seconds, the requests of ``--lengths`` in order: by default the agentic coding
   trace's first ``--lengths-window`` requests, repeated with fresh prefix ids, so that the
   sizes are steady too: the trace's later sessions are longer) on every fixed split of ``--instances`` (1 prefill + N-1 decode ... N-1 + 1).
   The best split is the one with the highest goodput (requests within both SLOs per
   second; ties: attainment, then TTFT p90).
2. **Loop.** The same load on a deployment started at ``--start P,D`` (a poor split), with
   the SLA planner scaling each role every 10 s of modelled time (new instances serve after
   ``--startup-s``; victims drain first) up to ``--max-replicas`` per role.
3. **Check.** The loop's settled split (the median ready replicas per role over the last
   third of the run) against the sweep: its prefill share beside the best split's, and, when
   the loop settled at another size, a sweep at that size too (``--sweep-settled``). It took
   ``converged_s``: the first minute after which each role's ready replicas stay within one
   of the settled count. On the way: replica-seconds, and the SLO attainment of the
   requests that arrived before and after convergence.

The planner prices with the engines' own performance profile (an exact model: telemetry's
fit of served records would converge to it; the fit itself is not in this loop).

    .venv/bin/python benchmarks/pd_closed_loop.py --out /tmp/pd_closed_loop.json   # ~3 min
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._harness import TRACES, command_line, emit_json, machine
from services.common.bench.stats import RequestResult, meets_slo
from services.common.bench.traces import Trace, load_trace
from services.sim import SimConfig, simulate
from services.sim.autoscale import AutoscaleConfig
from services.sim.curve import curve_trace, read_curve
from services.sim.results import request_results

LENGTHS = TRACES / "weka_agentic_dev.jsonl"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default=str(LENGTHS), help="trace whose requests arrive")
    p.add_argument("--lengths-window", type=int, default=600,
                   help="the first N requests of --lengths, repeated with fresh prefix ids "
                   "(0: the whole trace): a load steady in its sizes too")  # fmt: skip
    p.add_argument("--rate", type=float, default=2.0, help="steady arrivals, req/s")
    p.add_argument("--duration-s", type=float, default=1800.0, help="modelled seconds")
    p.add_argument("--instances", type=int, default=8, help="the sweep's fleet size")
    p.add_argument("--start", default="2,6", help="the loop's first split: prefill,decode")
    p.add_argument("--max-replicas", type=int, default=16, help="the loop: per role")
    p.add_argument("--startup-s", type=float, default=30.0)
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=100.0)
    p.add_argument("--engine-profile", default="h200-llama3.1-8b")
    p.add_argument("--sweep-settled", action="store_true",
                   help="also sweep the splits of the loop's settled size")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def steady_trace(args: argparse.Namespace, workdir: Path) -> Trace:
    curve = workdir / "flat.csv"
    curve.write_text(f"t_s,rate_rps\n0,{args.rate}\n{args.duration_s / 2},{args.rate}\n")
    lengths = load_trace(args.lengths)
    if args.lengths_window:
        lengths = replace(lengths, requests=lengths.requests[: args.lengths_window])
    return curve_trace(read_curve(curve), lengths, seed=args.seed)


def base_config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(engine_profile=args.engine_profile, seed=args.seed,
                     slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms)  # fmt: skip


def figures(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "goodput_rps": doc.get("goodput_rps"),
        "slo_attainment": doc.get("slo_attainment"),
        "ttft_p90_ms": (doc.get("ttft_ms") or {}).get("p90"),
        "tpot_p90_ms": (doc.get("tpot_ms") or {}).get("p90"),
        "failed": doc.get("failed"),
        "cache_hit_ratio": doc.get("cache_hit_ratio"),
    }


def sweep(base: SimConfig, trace: Trace, n: int) -> list[dict[str, Any]]:
    rows = []
    for p in range(1, n):
        doc, _ = simulate(replace(base, prefill=p, decode=n - p).validate(), trace)
        rows.append({"prefill": p, "decode": n - p, **figures(doc)})
    return rows


def best_split(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def key(r: dict[str, Any]) -> tuple[float, float, float]:
        return (r["goodput_rps"] or 0.0, r["slo_attainment"] or 0.0, -(r["ttft_p90_ms"] or 0.0))

    return max(rows, key=key)


def timeline_rows(csv_text: str) -> list[dict[str, float]]:
    return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(io.StringIO(csv_text))]


def settle(rows: list[dict[str, float]]) -> dict[str, Any]:
    """The settled split (median over the last third), whether the last third stayed within
    one replica per role (``stable``: False means still moving at the end), and the first
    minute after which each role stays within one replica of the settled split."""
    tail = rows[len(rows) - max(1, len(rows) // 3) :]
    roles = ("prefill", "decode")
    settled = {r: round(statistics.median(x[f"replicas_{r}"] for x in tail)) for r in roles}
    stable = all(
        max(x[f"replicas_{r}"] for x in tail) - min(x[f"replicas_{r}"] for x in tail) <= 1
        for r in roles
    )
    converged = len(rows)
    for i in range(len(rows) - 1, -1, -1):
        if any(abs(rows[i][f"replicas_{r}"] - settled[r]) > 1 for r in roles):
            break
        converged = i
    return {"settled": settled, "stable": stable, "converged_minute": converged}


def loop(base: SimConfig, trace: Trace, args: argparse.Namespace) -> dict[str, Any]:
    p0, d0 = (int(x) for x in args.start.split(","))
    auto = AutoscaleConfig(max_replicas=args.max_replicas, startup_s=args.startup_s,
                           ttft_ms=args.slo_ttft_ms, tpot_ms=args.slo_tpot_ms)  # fmt: skip
    cfg = replace(base, prefill=p0, decode=d0, autoscale=auto)
    doc, run = simulate(cfg.validate(), trace)
    rows = timeline_rows(run.timeline.csv_text())
    s = settle(rows)
    conv_s = s["converged_minute"] * cfg.timeline_s
    results = request_results(run)
    before = [x for r, x in zip(run.requests, results, strict=True) if r.arrival < conv_s * 1e3]
    after = [x for r, x in zip(run.requests, results, strict=True) if r.arrival >= conv_s * 1e3]
    replica_s = sum((x["replicas_prefill"] + x["replicas_decode"]) * cfg.timeline_s for x in rows)
    return {
        "start": {"prefill": p0, "decode": d0},
        "settled": s["settled"],
        "stable": s["stable"],
        "converged_s": conv_s,
        "replica_s": replica_s,
        "attainment_before_convergence": attainment(before, args),
        "attainment_after_convergence": attainment(after, args),
        "requests_before_convergence": len(before),
        "autoscale": doc["sim"]["autoscale"],
        **figures(doc),
        "timeline": [
            {
                "minute": int(x["minute"]),
                "prefill": int(x["replicas_prefill"]),
                "decode": int(x["replicas_decode"]),
                "queued": int(x["queued"]),
            }
            for x in rows
        ],
    }


def attainment(results: list[RequestResult], args: argparse.Namespace) -> float | None:
    """The share of ``results`` that completed within both SLOs (the bench's rule)."""
    if not results:
        return None
    ok = sum(1 for r in results if meets_slo(r, args.slo_ttft_ms, args.slo_tpot_ms))
    return round(ok / len(results), 4)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0, cpu0 = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        trace = steady_trace(args, Path(tmp))
    base = base_config(args)
    rows = sweep(base, trace, args.instances)
    best = best_split(rows)
    closed = loop(base, trace, args)
    s = closed["settled"]
    size = s["prefill"] + s["decode"]
    out: dict[str, Any] = {
        "benchmark": "pd_closed_loop", "command": command_line(), "machine": machine(),
        "workload": {"lengths": args.lengths, "rate_rps": args.rate,
                     "duration_s": args.duration_s, "requests": len(trace.requests)},
        "slo": {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms},
        "sweep": {"instances": args.instances, "splits": rows, "best": best},
        "loop": closed,
        "prefill_share": {"best_sweep": round(best["prefill"] / args.instances, 3),
                          "loop_settled": round(s["prefill"] / size, 3) if size else None},
    }  # fmt: skip
    if args.sweep_settled and size > 1 and size != args.instances:
        at = sweep(base, trace, size)
        out["sweep_at_settled_size"] = {"instances": size, "splits": at, "best": best_split(at)}
    out["wall"] = {"duration_s": round(time.perf_counter() - t0, 1),
                   "cpu_s": round(time.process_time() - cpu0, 1)}  # fmt: skip
    emit_json(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
