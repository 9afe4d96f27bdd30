"""What an engine failure costs, in ``tideserve sim``: per fleet kind, slice and seed, one run
with ``--fail-at-s`` half-way through the slice's arrivals and the same run without it.

Cases (the WEKA agentic trace, Claude Code sessions; ``--rate-scale`` of its recorded rate):

- ``aggregated``: ``--engines`` engines, one dies;
- ``pd_prefill`` / ``pd_decode``: ``--prefill`` + ``--decode`` engines, one of that role dies;
- ``memory_lru`` / ``memory_retention`` / ``memory_prefetch``: the aggregated fleet with agent
  memory in that mode, the trace's think times restored (``--memory-gap-scale``), engines of
  ``--memory-kv-blocks``: what the dead engine's sessions still find afterwards.

Per case, over slices x seeds (mean and spread = max - min, and every sample): requests
failed and retried, completed against the run without the failure, TTFT p90 and goodput as
a ratio to it, cached blocks lost; with agent memory, the sessions that held KV on the dead
engine and the reuse ratio of each one's first dispatch afterwards
(``agent_memory.after_failure``). The seed also picks which engine dies. Prints one JSON
object (also written to ``--out``).

    .venv/bin/python benchmarks/sim_failures.py --out /tmp/sim_failures.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _harness import TRACES, command_line, emit_json, machine  # noqa: E402

from services.common.bench.traces import Trace, load_trace  # noqa: E402
from services.sim import SimConfig, simulate  # noqa: E402

CASES = ("aggregated", "pd_prefill", "pd_decode", "memory_lru", "memory_retention",
         "memory_prefetch")  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", default=str(TRACES / "weka_agentic_dev.jsonl"))
    p.add_argument("--offsets", default="0,1000,2000", help="slices: first request of each")
    p.add_argument("--max-requests", type=int, default=1000, help="requests per slice")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--rate-scale", type=float, default=0.3)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--prefill", type=int, default=3)
    p.add_argument("--decode", type=int, default=5)
    p.add_argument("--kv-blocks", type=int, default=16384, help="per engine (64-token blocks)")
    p.add_argument("--memory-kv-blocks", type=int, default=2300)
    p.add_argument("--memory-gap-scale", type=float, default=10.0,
                   help="agent memory: the trace's gaps x this (10 restores its think times)")  # fmt: skip
    p.add_argument("--fail-detect-s", type=float, default=5.0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def case_config(case: str, a: argparse.Namespace, offset: int, seed: int) -> SimConfig:
    cfg = SimConfig(engines=a.engines, kv_blocks=a.kv_blocks, rate_scale=a.rate_scale,
                    max_requests=a.max_requests, offset=offset, seed=seed,
                    fail_detect_s=a.fail_detect_s)  # fmt: skip
    if case.startswith("pd_"):
        return replace(cfg, engines=0, prefill=a.prefill, decode=a.decode, fail_role=case[3:])
    if case.startswith("memory_"):
        return replace(cfg, agent_memory=case[7:], kv_blocks=a.memory_kv_blocks,
                       rate_scale=1.0 / a.memory_gap_scale)  # fmt: skip
    return cfg


def half_way_s(trace: Trace, cfg: SimConfig) -> float:
    """The modelled second half-way through the slice's arrivals."""
    reqs = trace.requests[cfg.offset :][: cfg.max_requests]
    span = (reqs[-1].arrival_s - reqs[0].arrival_s) / cfg.time_divisor
    return round(span / 2.0, 3)


def one(case: str, trace: Trace, a: argparse.Namespace, offset: int, seed: int) -> dict[str, Any]:
    base = case_config(case, a, offset, seed)
    at = half_way_s(trace, base)
    calm, _ = simulate(base, trace)
    hit, _ = simulate(replace(base, fail_at_s=at), trace)
    failure = hit["sim"]["failure"]
    row: dict[str, Any] = {
        "offset": offset, "seed": seed, "fail_at_s": at, "dead": failure["instances"],
        "failed": failure["requests_failed"], "retried": failure["retries"],
        "lost_blocks": failure["lost_blocks"],
        "completed": hit["completed"], "completed_without": calm["completed"],
        "ttft_p90_ratio": _ratio(hit["ttft_ms"]["p90"], calm["ttft_ms"]["p90"]),
        "goodput_ratio": _ratio(hit["goodput_rps"], calm["goodput_rps"]),
    }  # fmt: skip
    after = (hit["sim"]["agent_memory"] or {}).get("after_failure")
    if case.startswith("memory_"):
        row["sessions_hit"] = after["sessions"] if after else 0
        row["after_failure_reuse"] = after["reuse_ratio"] if after else None
        row["reuse_ratio_without"] = calm["sim"]["agent_memory"]["reuse_ratio"]
    return row


def _ratio(x: float | None, y: float | None) -> float | None:
    return round(x / y, 4) if x is not None and y else None


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in rows[0]:
        if key in ("offset", "seed", "dead"):
            continue
        vals = [r[key] for r in rows if isinstance(r[key], (int, float))]
        if vals:
            out[key] = {"mean": round(statistics.fmean(vals), 4),
                        "spread": round(max(vals) - min(vals), 4), "n": len(vals)}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    unknown = set(a.cases.split(",")) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; known: {', '.join(CASES)}")
    trace = load_trace(a.trace)
    offsets = [int(x) for x in a.offsets.split(",")]
    seeds = [int(x) for x in a.seeds.split(",")]
    t0 = time.process_time()
    cases: dict[str, Any] = {}
    for case in a.cases.split(","):
        rows = [one(case, trace, a, off, seed) for off in offsets for seed in seeds]
        cases[case] = {"summary": aggregate(rows), "runs": rows}
    emit_json({"benchmark": "sim_failures", "command": command_line(), "machine": machine(),
               "args": vars(a), "cases": cases,
               "cpu_s": round(time.process_time() - t0, 1)}, a.out)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
