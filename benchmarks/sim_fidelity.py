"""How close `tideserve sim` comes to the live local stack: the gap per percentile.

Per cell (a slice of a trace at a rate): the same requests run live — a fresh fleet of
``--engines`` simulated engines (``tideserve engine`` processes pacing in real time) behind
``tideserve gateway`` with its default profile, replayed by ``tideserve bench``, exactly as
``routing_compare.py`` runs Tideserve (its figures-of-record rules: the engines run
``--profile`` ``--engine-slowdown`` times slower than the gateway's shipped perf profile, the
SLO reaches the gateway as its default class's targets) — and in ``tideserve sim`` with the
same fleet, profiles, KV size, stream interval, rate and SLO. Latencies are in trace time on
both sides (the bench's ``--trace-time``), so ``--speedup`` only shortens the live run.

Reported per cell and metric (TTFT and TPOT mean, p50, p90, p99; hit ratio; goodput): the
live value (mean over ``--runs``, with each run's), the simulated one, and the gap
``sim / live - 1``; the summary has the largest and mean absolute gap per metric over the
cells. The simulator models no HTTP, CPU or network cost and no machine noise: a positive
live excess on TTFT is largely that. Each live run records whether the machine was CPU
saturated (``cpu.saturated``), in which case it is not a clean figure.

    .venv/bin/python benchmarks/sim_fidelity.py --out /tmp/sim_fidelity.json   # ~10 min

Cells: ``NAME:OFFSET:N:RATE`` with NAME ``conversation`` (the Mooncake conversation trace),
``agentic`` (the WEKA agentic development trace) or a path. Prints one JSON object (also
written to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import routing_compare
import yaml
from _compare_rules import slo_config
from _harness import MOONCAKE_CONVERSATION, TRACES, command_line, machine, tideserve
from _sim_stats import gap_summary

from services.common.bench.traces import load_trace
from services.sim import SimConfig, simulate

AGENTIC = TRACES / "weka_agentic_dev.jsonl"
DEFAULT_CELLS = "conversation:0:400:2.5,conversation:6000:400:2.5,agentic:0:300:0.5"
METRICS = (
    ("ttft_ms", "mean"), ("ttft_ms", "p50"), ("ttft_ms", "p90"), ("ttft_ms", "p99"),
    ("tpot_ms", "mean"), ("tpot_ms", "p50"), ("tpot_ms", "p90"), ("tpot_ms", "p99"),
    ("cache_hit_ratio", ""), ("goodput_rps", ""),
)  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cells", default=DEFAULT_CELLS, help="comma list of NAME:OFFSET:N:RATE")
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--profile", default="h200-llama3.1-8b", help="engine perf profile")
    p.add_argument("--engine-slowdown", type=float, default=1.2)
    p.add_argument("--speedup", type=float, default=2.0, help="live: engines and replay")
    p.add_argument("--runs", type=int, default=1, help="live runs per cell")
    p.add_argument("--kv-blocks", type=int, default=16384)
    p.add_argument("--stream-interval", type=int, default=16)
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=100.0)
    p.add_argument("--out", default="sim_fidelity.json")
    p.add_argument("--log-dir", default=None)
    return p.parse_args(argv)


def parse_cell(text: str) -> tuple[Path, int, int, float, str]:
    """(trace path, offset, requests, rate scale, label) of ``NAME:OFFSET:N:RATE``."""
    name, offset, n, rate = text.rsplit(":", 3)
    path = {"conversation": MOONCAKE_CONVERSATION, "agentic": AGENTIC}.get(name, Path(name))
    return path, int(offset), int(n), float(rate), f"{Path(name).stem}@{offset}+{n}x{rate}"


def write_slice(src: Path, offset: int, n: int, dest: Path) -> Path:
    """Requests ``[offset, offset + n)`` of a Mooncake JSONL trace, timestamps from 0."""
    lines = [ln for ln in src.read_text(encoding="utf-8").splitlines() if ln.strip()]
    rows = [json.loads(ln) for ln in lines[offset : offset + n]]
    t0 = rows[0]["timestamp"] if rows else 0
    dest.write_text("".join(json.dumps({**r, "timestamp": r["timestamp"] - t0}) + "\n"
                            for r in rows), encoding="utf-8")  # fmt: skip
    return dest


def value(doc: dict[str, Any], key: str, q: str) -> float | None:
    v = doc.get(key)
    if q:
        v = v.get(q) if isinstance(v, dict) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def gaps(live: list[dict[str, Any]], sim: dict[str, Any]) -> dict[str, Any]:
    """Per metric: the live runs' values and mean, the simulated value, sim / live - 1."""
    out: dict[str, Any] = {}
    for key, q in METRICS:
        runs = [v for v in (value(r, key, q) for r in live) if v is not None]
        mean = sum(runs) / len(runs) if runs else None
        s = value(sim, key, q)
        gap = round(s / mean - 1.0, 4) if s is not None and mean else None
        out[f"{key}.{q}" if q else key] = {
            "live": round(mean, 4) if mean is not None else None,
            "live_runs": [round(v, 4) for v in runs],
            "sim": round(s, 4) if s is not None else None,
            "gap": gap,
        }
    return out


def summarize(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric over the cells: the largest and mean absolute gap, and how many are within
    10 %."""
    out: dict[str, Any] = {}
    for key, q in METRICS:
        name = f"{key}.{q}" if q else key
        gs = [c["gaps"][name]["gap"] for c in cells if c.get("gaps", {}).get(name, {}).get("gap")
              is not None]  # fmt: skip
        if gs:
            out[name] = gap_summary(gs, digits=4)
    return out


def run_cell(text: str, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    src, offset, n, rate, label = parse_cell(text)
    path = write_slice(src, offset, n, log_dir / f"{label.replace('+', '_')}.jsonl")
    cell: dict[str, Any] = {"cell": label, "trace": str(src), "offset": offset,
                            "requests": n, "rate_scale": rate}  # fmt: skip
    rc = routing_compare.parse_args([
        "--routers", "tideserve:default", "--engines", str(args.engines), "--trace", str(path),
        "--max-requests", str(n), "--speedup", str(args.speedup), "--rate-scale", str(rate),
        "--profile", args.profile, "--engine-slowdown", str(args.engine_slowdown),
        "--kv-blocks", str(args.kv_blocks), "--stream-interval", str(args.stream_interval),
        "--slo-ttft-ms", str(args.slo_ttft_ms), "--slo-tpot-ms", str(args.slo_tpot_ms),
    ])  # fmt: skip
    rc.slo_config_file = log_dir / "slo.yaml"
    rc.slo_config_file.write_text(
        yaml.safe_dump(slo_config(args.slo_ttft_ms, args.slo_tpot_ms), sort_keys=False),
        encoding="utf-8",
    )
    live = [routing_compare.run_router("tideserve:default", rc, log_dir, None, {"run": r})
            for r in range(args.runs)]  # fmt: skip
    cell["live_errors"] = [r["error"] for r in live if "error" in r]
    cell["live_saturated"] = [bool((r.get("cpu") or {}).get("saturated")) for r in live]
    cfg = SimConfig(
        engines=args.engines, engine_profile=f"{args.profile}*{args.engine_slowdown:g}",
        gateway_perf_profile=args.profile, rate_scale=rate, max_requests=n,
        kv_blocks=args.kv_blocks, stream_interval=args.stream_interval,
        slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
    ).validate()  # fmt: skip
    sim, _ = simulate(cfg, load_trace(str(path)))
    cell["sim_command"] = "tideserve " + shlex.join(tideserve(
        "sim", "--trace", str(path), "--max-requests", str(n), "--engines", str(args.engines),
        "--engine-profile", cfg.engine_profile, "--gateway-perf-profile", args.profile,
        "--rate-scale", str(rate), "--kv-blocks", str(args.kv_blocks),
        "--slo-ttft-ms", str(args.slo_ttft_ms), "--slo-tpot-ms", str(args.slo_tpot_ms),
        "--out", "sim.json",
    )[3:])  # fmt: skip
    cell["live_commands"] = [r.get("bench_command") for r in live]
    cell["gaps"] = gaps([r for r in live if "error" not in r], sim)
    print(f"[{label}] {json.dumps({k: v['gap'] for k, v in cell['gaps'].items()})}",
          file=sys.stderr, flush=True)  # fmt: skip
    return cell


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="tideserve-sim-fidelity-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"benchmark": "sim_fidelity", "command": command_line(),
                           "machine": machine(), "cells": []}  # fmt: skip
    for text in [c.strip() for c in args.cells.split(",") if c.strip()]:
        doc["cells"].append(run_cell(text, args, log_dir))
    doc["summary"] = summarize(doc["cells"])
    text = json.dumps(doc, indent=2)
    Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
