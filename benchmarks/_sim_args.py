"""The command line of `routing_sim.py` (its options, parsed; no other logic)."""

from __future__ import annotations

import argparse
from pathlib import Path

from services.common.admission.shaper_config import DISPATCH_HOLD_MS, DISPATCH_ORDER


def parse_args(argv: list[str] | None, description: str, trace: Path) -> argparse.Namespace:
    """``routing_sim.py``'s options (``description``: its docstring; ``trace``: the default)."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--trace", default=str(trace), help="Mooncake-format trace (JSONL)")
    p.add_argument("--max-requests", type=int, default=400, help="first N requests (default 400)")
    p.add_argument("--offset", type=int, default=0, help="skip this many requests first")
    p.add_argument("--rate-scale", type=float, default=2.5, help="divide arrival times by this")
    p.add_argument("--engines", type=int, default=8, help="aggregated engines (default 8)")
    p.add_argument("--pd", action="store_true", help="P/D: --prefill + --decode engines")
    p.add_argument("--prefill", type=int, default=3)
    p.add_argument("--decode", type=int, default=5)
    p.add_argument(
        "--decode-can-prefill",
        action="store_true",
        help="P/D: decode engines may compute a prompt alone (vLLM-like; default: no, as "
        "SGLang decode servers and `tideserve gateway --pd-protocol sglang`)",
    )
    p.add_argument("--profiles-file", default=None, help="profiles YAML (default: shipped)")
    p.add_argument(
        "--profiles",
        default="default,cache_aware,round_robin",
        help="comma-separated profile names, each run on a fresh fleet",
    )
    p.add_argument("--perf-profile", default="h200-llama3.1-8b")
    p.add_argument("--kv-blocks", type=int, default=16384)
    p.add_argument("--block-size", type=int, default=64, help="engine and gateway block size")
    p.add_argument("--stream-interval", type=int, default=16, help="engines' SSE coalescing")
    p.add_argument("--load-source", choices=("scrape", "stream"), default="scrape")
    p.add_argument(
        "--precise",
        action="store_true",
        help="give every pick precise prefix data: each engine's resident prefix of the "
        "request (GPU tier) at arrival, as a lag-free KV index would (kvmeta or the local "
        "replica, without event delay)",
    )
    p.add_argument("--scrape-interval-ms", type=float, default=500.0)
    p.add_argument("--scrape-lag-ms", type=float, default=5.0)
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=100.0)
    p.add_argument(
        "--shaper-hold-ms",
        type=float,
        default=DISPATCH_HOLD_MS,
        help="dispatch order (services.common.admission.shaper): hold picks for an "
        "instance whose predicted prefill backlog is at least this (default: the shipped "
        "gateway's; 0 = off, every pick sent at once); applies to --shaped-profiles",
    )
    p.add_argument("--shaper-age-weight", type=float, default=1.0)
    p.add_argument("--shaper-order", choices=("shortest", "slo"), default=DISPATCH_ORDER)
    p.add_argument(
        "--shaped-profiles",
        default="default",
        help="comma list of the profiles the shaper applies to (baselines never)",
    )
    p.add_argument("--seed", type=int, default=0, help="routing RNG seed")
    p.add_argument(
        "--step-traces",
        default=None,
        metavar="DIR",
        help="write each engine's steps as the live engine's --step-trace does "
        "(DIR/<profile>-engine-<i>.steps.jsonl; benchmarks/step_trace_summary.py)",
    )
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        default=None,
        help="also draw each profile's TTFT CDF (services.common.bench.plot; needs matplotlib)",
    )
    return p.parse_args(argv)
