"""Several gateway replicas against one, in virtual time: what sharing state between them is
worth.

``tideserve up`` runs one gateway process per core, sharing routed prefixes, in-flight load
and their dispatch orders' backlogs through Redis. Each replica still decides alone: it
knows the others' picks 5 ms late and their load from a heartbeat every 0.1 s. Per cell (a
trace slice at a rate, on a fleet) and per variant, a fresh run of ``tideserve sim``'s
simulator (:mod:`services.sim`) with the default profile and the SLO of the routing
benchmarks (TTFT 2 s, TPOT 100 ms); requests go to a replica drawn at random, as a kernel
spreads connections over SO_REUSEPORT listeners:

* ``1``: one gateway (the reference);
* ``N-alone``: N replicas that share nothing (``share_state`` off);
* ``N-shared``: N replicas sharing state as ``tideserve up`` runs them.

Cells: ``KIND:OFFSET:REQUESTS:RATE[:FLEET]``, KIND ``agentic`` (``weka_agentic_dev.jsonl``)
or ``conversation`` (the Mooncake conversation trace), FLEET ``8`` aggregated engines (the
default) or ``4+4`` prefill+decode.

    .venv/bin/python benchmarks/gateway_replicas_sim.py --out /tmp/replicas.json

Prints one JSON object: per cell and variant TTFT mean/p90, TPOT mean, goodput, hit ratio,
and each variant's TTFT mean as a multiple of one gateway's; ``summary``: per variant the
mean, min and max of that multiple over the cells.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _harness import MOONCAKE_CONVERSATION, TRACES, command_line, emit_json  # noqa: E402

from services.common.bench.traces import load_trace  # noqa: E402
from services.sim import SimConfig, simulate  # noqa: E402

TRACE_OF = {"agentic": TRACES / "weka_agentic_dev.jsonl", "conversation": MOONCAKE_CONVERSATION}
DEFAULT_CELLS = (
    "agentic:0:600:0.5,agentic:1200:600:0.5,agentic:2400:600:0.5,agentic:600:600:1,"
    "conversation:2000:1000:2.5,agentic:1200:600:0.5:4+4"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cells", default=DEFAULT_CELLS, help="comma list of cells (see above)")
    p.add_argument("--replicas", type=int, default=2, help="N of the N-replica variants")
    p.add_argument("--seeds", default="0", help="comma list: each seed draws replicas anew")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def config(cell: str, gateways: int, share: bool, seed: int) -> SimConfig:
    _, off, n, rate, *fleet = cell.split(":")
    pd = fleet and "+" in fleet[0]
    p, d = (int(x) for x in fleet[0].split("+")) if pd else (0, 0)
    return SimConfig(
        engines=int(fleet[0]) if fleet and not pd else 8, prefill=p, decode=d,
        decode_keeps_kv=bool(pd), short_first_tokens=16384, gateways=gateways,
        share_state=share, seed=seed, rate_scale=float(rate), offset=int(off),
        max_requests=int(n), slo_ttft_ms=2000.0, slo_tpot_ms=100.0,
    ).validate()  # fmt: skip


def figures(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "ttft_mean_ms": doc["ttft_ms"]["mean"],
        "ttft_p90_ms": doc["ttft_ms"]["p90"],
        "tpot_mean_ms": doc["tpot_ms"]["mean"],
        "goodput_rps": doc.get("goodput_rps"),
        "cache_hit_ratio": doc["cache_hit_ratio"],
        "failed": doc["failed"],
    }


def run_cell(cell: str, n: int, seed: int) -> dict[str, Any]:
    trace = load_trace(str(TRACE_OF[cell.split(":")[0]]))
    variants = {"1": (1, True), f"{n}-alone": (n, False), f"{n}-shared": (n, True)}
    out: dict[str, Any] = {}
    for name, (g, share) in variants.items():
        doc, _ = simulate(config(cell, g, share, seed), trace)
        out[name] = figures(doc)
        print(f"[{cell} seed {seed}] {name}: {out[name]}", file=sys.stderr, flush=True)
    base = out["1"]["ttft_mean_ms"]
    for v in out.values():
        v["ttft_mean_vs_one"] = round(v["ttft_mean_ms"] / base, 3) if base else None
    return out


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    cells = [c.strip() for c in a.cells.split(",") if c.strip()]
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    rows = {f"{c}|seed{s}": run_cell(c, a.replicas, s) for c in cells for s in seeds}
    summary: dict[str, Any] = {}
    for name in next(iter(rows.values())):
        xs = [r[name]["ttft_mean_vs_one"] for r in rows.values()]
        summary[name] = {"ttft_mean_vs_one": {"mean": round(statistics.fmean(xs), 3),
                                              "min": min(xs), "max": max(xs)}}  # fmt: skip
    emit_json({"benchmark": "gateway_replicas_sim", "command": command_line(),
               "cells": rows, "summary": summary}, a.out)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
