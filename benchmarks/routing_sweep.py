"""Routing profiles over a grid of trace slices x loads, in virtual time: means and spreads.

A tuning tool over ``routing_sim.py``'s simulator (same engines, gateway core and options):
one fresh fleet per (slice, load, profile), then per profile and load the mean, min and max
over slices of mean/p90 TTFT, mean TPOT, goodput, cache hit and failures, and each
profile's ratio to ``--baseline`` cell by cell (mean and spread of the ratios). A policy is
judged on the whole grid, never on one slice.

    python benchmarks/routing_sweep.py --trace ../shared/traces/weka_agentic_dev.jsonl \\
        --slices 0,1200,2400 --max-requests 600 --rate-scales 0.5,1 \\
        --profiles default,agent,cache_aware --baseline cache_aware

Options after ``--`` go to routing_sim unchanged (``-- --pd --prefill 4 --decode 4``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import routing_sim
from _harness import emit_json

from services.common.bench.traces import load_trace

METRICS = (
    "ttft_mean",
    "ttft_p90",
    "tpot_mean",
    "goodput_rps",
    # the share of all requests that met both SLOs: goodput can exceed a router's by at
    # most 1 / its attainment
    "slo_attainment",
    "cache_hit_ratio",
    "failed",
    # where the mean TTFT goes (routing_sim's time_split) and the picks that left the
    # instance holding the longest routed prefix
    "own_prefill_ms",
    "wait_ms",
    "first_chunk_ms",
    "mixed_step_share",
    "busy_share",
    "spills",
)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", default=str(routing_sim.TRACE))
    p.add_argument("--slices", default="0", help="comma-separated offsets")
    p.add_argument("--max-requests", type=int, default=600)
    p.add_argument("--rate-scales", default="1", help="comma-separated rate scales")
    p.add_argument("--profiles", default="default,cache_aware")
    p.add_argument("--baseline", default="cache_aware", help="profile the ratios are taken to")
    p.add_argument("--profiles-file", default=None)
    p.add_argument("--out", default=None, help="also write the JSON here")
    argv = sys.argv[1:] if argv is None else argv
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1 :]
    return p.parse_args(argv), rest


def cell(res: dict[str, Any]) -> dict[str, float]:
    """The figures of one run that the sweep aggregates."""
    ttft, tpot = res["ttft_ms"] or {}, res["tpot_ms"] or {}
    split = res.get("time_split_ms") or {}
    return {
        "ttft_mean": ttft.get("mean", float("nan")),
        "ttft_p90": ttft.get("p90", float("nan")),
        "tpot_mean": tpot.get("mean", float("nan")),
        "goodput_rps": res["goodput_rps"] or 0.0,
        "slo_attainment": res["slo_attainment"],
        "cache_hit_ratio": res["cache_hit_ratio"],
        "failed": res["failed"] + res["shed"],
        "own_prefill_ms": split.get("own_prefill", 0.0),
        "wait_ms": split.get("wait", 0.0),
        "first_chunk_ms": split.get("first_chunk", 0.0),
        "mixed_step_share": split.get("mixed_step_share", 0.0),
        "busy_share": split.get("busy_share", 0.0),
        "spills": res["routing"]["with_routed_prefix"] - res["routing"]["kept_best_prefix"],
    }


def spread(xs: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(xs), 4),
        "min": round(min(xs), 4),
        "max": round(max(xs), 4),
    }


def aggregate(
    runs: list[dict[str, Any]], profiles: list[str], scales: list[float], baseline: str
) -> dict[str, Any]:
    """Per load and profile: each metric's spread over slices, and the spread of the
    cell-by-cell ratio to ``baseline``."""
    out: dict[str, Any] = {}
    for s in scales:
        at = [r for r in runs if r["rate_scale"] == s]
        by: dict[str, Any] = {}
        for prof in profiles:
            mine = [r for r in at if r["profile"] == prof]
            row: dict[str, Any] = {m: spread([r["cell"][m] for r in mine]) for m in METRICS}
            if prof != baseline:
                ratios: dict[str, Any] = {}
                for m in ("ttft_mean", "ttft_p90", "tpot_mean", "goodput_rps"):
                    xs = []
                    for r in mine:
                        b = next(
                            x for x in at if x["profile"] == baseline and x["slice"] == r["slice"]
                        )
                        if b["cell"][m]:
                            xs.append(r["cell"][m] / b["cell"][m])
                    if xs:
                        ratios[m] = spread(xs)
                row[f"vs_{baseline}"] = ratios
            by[prof] = row
        out[str(s)] = by
    return out


def main(argv: list[str] | None = None) -> int:
    a, rest = parse_args(argv)
    trace = load_trace(a.trace).requests
    profiles = [p.strip() for p in a.profiles.split(",") if p.strip()]
    if a.baseline not in profiles:
        profiles.append(a.baseline)
    scales = [float(x) for x in a.rate_scales.split(",")]
    slices = [int(x) for x in a.slices.split(",")]
    runs: list[dict[str, Any]] = []
    for off in slices:
        part = trace[off:][: a.max_requests]
        if not part:
            print(f"slice at {off} is empty", file=sys.stderr)
            return 1
        for s in scales:
            extra = ["--rate-scale", str(s), *rest]
            if a.profiles_file:
                extra += ["--profiles-file", a.profiles_file]
            sim_args = routing_sim.parse_args(extra)
            for prof in profiles:
                res = routing_sim.Sim(sim_args, prof, part).run()
                run = {"slice": off, "rate_scale": s, "profile": prof, "cell": cell(res)}
                runs.append(run)
                print(json.dumps(run), file=sys.stderr, flush=True)
    out = {
        "tool": "routing_sweep (virtual time, routing_sim's model)",
        "args": {**vars(a), "sim_args": rest},
        "summary": aggregate(runs, profiles, scales, a.baseline),
        "runs": runs,
    }
    emit_json(out, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
