"""The live goodput cells again in the simulator: per cell and router, live against sim.

Reads the state file of ``goodput_live.py`` (its cells, each with the ``routing_compare``
document of its runs), runs every cell in ``tideserve sim``'s simulator with the live rules
(8 engines ``--engine-profile`` ``--engine-slowdown`` times slower than the gateway's perf
profile, the cell's slice, requests and rate, the SLO, stream interval 16, fresh fleet) and
prints, per cell and router, the live means over runs, the simulated figures and the gap
``sim / live - 1``: goodput, SLO attainment, TTFT mean/p50/p90/p99, TPOT mean/p50/p90, cache
hit ratio and duration; and ``fidelity``, per TTFT and TPOT percentile over the rows whose live
runs were not CPU-saturated, the largest and mean gap and the rows within 10 %. ``tideserve:<profile>`` runs as that profile with the gateway's dispatch order;
``sglang:cache_aware`` as the ``cache_aware`` profile (sglang-router's decision) without it,
and, with ``--also``, as other profiles too (``--also cache_aware_scored``: the earlier
imitation). ``--sglang-load-sources scrape,stream`` runs every ``sglang:`` row once per load
signal: ``scrape`` (the default) gives the simulated router the engines' loads as the
gateway's scrapes report them, ``stream`` every change at once, as sglang-router's own
in-flight counters have them.

    .venv/bin/python benchmarks/goodput_sim_vs_live.py --state /tmp/goodput_live_state.json [MORE ...]

Prints one JSON object (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, cast, get_args

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _harness import MOONCAKE_CONVERSATION, TRACES, emit_json  # noqa: E402
from _sim_stats import gap_summary  # noqa: E402

from services.common.bench.traces import load_trace  # noqa: E402
from services.sim import SimConfig, simulate  # noqa: E402
from services.sim.config import LoadSource  # noqa: E402

METRICS = (
    ("goodput_rps", ""), ("slo_attainment", ""), ("ttft_ms", "mean"), ("ttft_ms", "p50"),
    ("ttft_ms", "p90"), ("ttft_ms", "p99"), ("tpot_ms", "mean"), ("tpot_ms", "p50"),
    ("tpot_ms", "p90"), ("cache_hit_ratio", ""), ("duration_s", ""),
)  # fmt: skip
# The fidelity target's figures: the simulator within 10 % of live on each.
PERCENTILES = ("ttft_ms.p50", "ttft_ms.p90", "ttft_ms.p99", "tpot_ms.p50", "tpot_ms.p90")
TRACE_OF = {"agentic": TRACES / "weka_agentic_dev.jsonl", "conversation": MOONCAKE_CONVERSATION}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--state", required=True, nargs="+", help="goodput_live.py's --state files")
    p.add_argument("--also", default="", help="more profiles for sglang:cache_aware (comma list)")
    p.add_argument(
        "--sglang-load-sources", default="scrape",
        help="comma list of load signals for the sglang rows (scrape, stream)",
    )  # fmt: skip
    p.add_argument(
        "--sglang-end-lag-ms", type=float, default=0.0,
        help="the sglang rows' router learns a request ended this long after its last step",
    )  # fmt: skip
    p.add_argument("--engine-profile", default="h200-llama3.1-8b")
    p.add_argument("--engine-slowdown", type=float, default=1.2)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    bad = [x for x in a.sglang_load_sources.split(",") if x not in get_args(LoadSource)]
    if bad:
        p.error(f"--sglang-load-sources: unknown {bad}; choose from {get_args(LoadSource)}")
    return a


def figure(doc: dict[str, Any], key: str, q: str) -> float | None:
    v = doc.get(key)
    v = v.get(q) if q and isinstance(v, dict) else (None if q else v)
    return float(v) if isinstance(v, int | float) else None


def saturated(runs: list[dict[str, Any]]) -> bool:
    """Whether any live run was CPU-saturated (the bench's own flag; a saturated live run
    is slower than the engines' model, so it says nothing of the simulator's fidelity)."""
    return any(bool((r.get("cpu") or {}).get("saturated")) for r in runs)


def live_means(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key, q in METRICS:
        vals = [v for r in runs if (v := figure(r, key, q)) is not None]
        out[f"{key}.{q}" if q else key] = sum(vals) / len(vals) if vals else None
    return out


def fidelity(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per percentile of the target, over the rows whose live runs were none CPU-saturated:
    the largest gap either way, the mean absolute gap and how many rows are within 10 %."""
    clean = [r for r in rows if not r["live_saturated"]]
    out: dict[str, Any] = {"rows": len(clean), "rows_saturated_left_out": len(rows) - len(clean)}
    for k in PERCENTILES:
        gaps = [g for r in clean if (g := r["gap"].get(k)) is not None]
        if gaps:
            out[k] = gap_summary(gaps)
    return out


def sim_figures(
    a: argparse.Namespace, cell: str, profile: str, baseline: bool, load_source: str = "scrape"
) -> dict[str, Any]:
    kind, off, n, rate = cell.split(":")
    cfg = SimConfig(
        engines=8, profile=profile, engine_profile=f"{a.engine_profile}*{a.engine_slowdown:g}",
        gateway_perf_profile=a.engine_profile, rate_scale=float(rate), max_requests=int(n),
        offset=int(off), kv_blocks=16384, stream_interval=16, slo_ttft_ms=2000.0,
        slo_tpot_ms=100.0, load_source=cast(LoadSource, load_source),
        **({"shaper_hold_ms": 0.0, "end_lag_ms": a.sglang_end_lag_ms} if baseline else {}),
    )  # fmt: skip
    doc, _ = simulate(cfg, load_trace(str(TRACE_OF[kind])))
    return {f"{k}.{q}" if q else k: figure(doc, k, q) for k, q in METRICS}


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    rows: list[dict[str, Any]] = []
    for path in a.state:
        rows += compare_state(a, json.loads(Path(path).read_text(encoding="utf-8")))
    doc = {"benchmark": "goodput_sim_vs_live", "state": a.state, "fidelity": fidelity(rows),
           "rows": rows}  # fmt: skip
    emit_json(doc, a.out)
    return 0


def compare_state(a: argparse.Namespace, state: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key, entry in state["cells"].items():
        cell = key.split("|")[0]
        results = entry.get("compare", {}).get("results", [])
        commit = entry.get("compare", {}).get("machine", {}).get("git_commit")
        for router in sorted({r["router"] for r in results}):
            runs = [r for r in results if r["router"] == router and "error" not in r]
            kind, _, policy = router.partition(":")
            if kind == "sglang":
                names = [policy] + [p for p in a.also.split(",") if p]
                sources = [x for x in a.sglang_load_sources.split(",") if x]
                profiles = [(n, src) for n in names for src in sources]
            else:
                profiles = [(policy or "default", "scrape")]
            live = live_means(runs)
            for prof, src in profiles:
                sim = sim_figures(a, cell, prof, kind == "sglang", src)
                gap = {k: round(s / v - 1.0, 3) if (s := sim[k]) is not None and v else None
                       for k, v in live.items()}  # fmt: skip
                rows.append({"cell": cell, "router": router, "sim_profile": prof,
                             "sim_load_source": src,
                             "live_runs": len(runs), "live_saturated": saturated(runs),
                             "live_commit": commit, "live": live, "sim": sim, "gap": gap})  # fmt: skip
                print(f"{cell} {router} as {prof} ({src}): gap {gap}", file=sys.stderr, flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
