"""How fast ``tideserve sim``'s event loop runs: requests per wall second at fleet sizes.

For each ``--instances`` N the trace is replayed at ``--rate-scale-per-8 x N / 8`` times its
recorded rate (the load per engine stays that of ``routing_sim.py``'s 8-engine default), so
a bigger fleet does proportionally more work per modelled second; ``--requests`` requests
each (the trace repeats with fresh prefix ids when shorter). Prints one JSON object: per
size the instances, requests, wall seconds, requests/s, CPU seconds and requests per CPU
second (what the run itself cost, less sensitive to the machine's other work), events and
events/s, and the figures that show the run was loaded (completed, cache hit ratio, mean
TTFT).

    nice -n 10 .venv/bin/python benchmarks/sim_speed.py --instances 8,100,1000 \\
        --requests 2000,5000,20000

Run it alone (the machine's other work shows up as a lower rate); ``--profile-out FILE``
also writes a cProfile of the last size (from request ``--profile-from`` K on: a late
window of a long run).
"""

from __future__ import annotations

import argparse
import cProfile
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _harness import MOONCAKE_CONVERSATION, emit_json  # noqa: E402

from services.common.bench.traces import load_trace  # noqa: E402
from services.sim import SimConfig, simulate  # noqa: E402
from services.sim.run import Simulation  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trace", default=str(MOONCAKE_CONVERSATION))
    p.add_argument("--instances", default="8,100,1000", help="comma list of fleet sizes")
    p.add_argument("--requests", default="2000", help="comma list (one per size, or one)")
    p.add_argument("--rate-scale-per-8", type=float, default=2.5)
    p.add_argument("--profile", default="default", help="routing profile")
    p.add_argument("--gateways", type=int, default=1)
    p.add_argument("--profile-out", default=None, help="cProfile stats of the last size")
    p.add_argument(
        "--profile-from", type=int, default=0,
        help="start the profile when request K arrives (a late window of a long run)",
    )  # fmt: skip
    p.add_argument("--out", default=None, help="also write the JSON here")
    return p.parse_args(argv)


def one(trace_path: str, n: int, requests: int, a: argparse.Namespace, prof: bool) -> Any:
    trace = load_trace(trace_path)
    cfg = SimConfig(
        engines=n,
        max_requests=requests,
        rate_scale=a.rate_scale_per_8 * n / 8,
        profile=a.profile,
        gateways=a.gateways,
    )
    profiler = cProfile.Profile() if prof else None
    if profiler is not None and a.profile_from <= 0:
        profiler.enable()
    elif profiler is not None:
        _enable_at(profiler, a.profile_from)
    doc, run = simulate(cfg, trace)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(a.profile_out)
    wall, cpu = doc["wall"]["duration_s"], doc["wall"]["cpu_s"]
    return {
        "instances": n,
        "requests": requests,
        "wall_s": wall,
        "requests_per_s": round(requests / wall, 1) if wall > 0 else None,
        "cpu_s": cpu,
        "requests_per_cpu_s": round(requests / cpu, 1) if cpu > 0 else None,
        "events": run.events,
        "events_per_s": round(run.events / wall) if wall > 0 else None,
        "completed": doc["completed"],
        "cache_hit_ratio": doc["cache_hit_ratio"],
        "ttft_mean_ms": doc["ttft_ms"]["mean"],
        "modelled_s": doc["duration_s"],
    }


def _enable_at(profiler: cProfile.Profile, k: int) -> None:
    """Switch ``profiler`` on when request ``k`` arrives (wraps the loop's handler)."""
    arrive = Simulation.arrive

    def at(self: Simulation, i: int, now: float) -> int:
        if i == k:
            profiler.enable()
        return arrive(self, i, now)

    Simulation.arrive = at  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    sizes = [int(x) for x in a.instances.split(",")]
    counts = [int(x) for x in a.requests.split(",")]
    if len(counts) == 1:
        counts *= len(sizes)
    if len(counts) != len(sizes):
        print("--requests: give one count or one per size", file=sys.stderr)
        return 2
    rows = []
    for k, (n, r) in enumerate(zip(sizes, counts, strict=True)):
        last = k == len(sizes) - 1
        rows.append(one(a.trace, n, r, a, bool(a.profile_out) and last))
        print(rows[-1], file=sys.stderr, flush=True)
    emit_json({"tool": "sim_speed", "trace": a.trace, "runs": rows}, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
