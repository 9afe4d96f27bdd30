"""Routing for goodput in virtual time: profiles over agentic and conversation slices, with
each cell's ceiling.

For every cell (a slice of a trace at a rate) and every profile: a fresh fleet in
``tideserve sim``'s simulator (:mod:`services.sim`), under the figures-of-record rules of
``routing_compare.py``: the engines run ``--engine-profile`` ``--engine-slowdown`` times
slower, the gateway prices with its shipped default profile, and requests carry the SLO
(``--slo-ttft-ms``/``--slo-tpot-ms``) as their class targets. Per cell and profile: goodput
(requests meeting both SLOs per modelled second of the run's duration, first arrival to last
completion), SLO attainment, the duration, TTFT mean/p90, TPOT mean, cache hit ratio; per
cell the ceiling, computed the same way for every cell: the share of requests no router
could serve within the TTFT SLO, those whose prefill alone, on an idle
engine with the best cache any router could have given them (the longest prefix of their
blocks that an earlier request of the slice carried and could have finished computing, on an
idle engine, before they arrived), plus the ``stream_interval - 1``
decode steps before the first streamed chunk, exceeds it (``max_attainment`` = 1 - that).

Profiles: the shipped ones, plus (when the shipped file has none of that name) the
candidate ``goodput`` below. ``cache_aware`` is sglang-router's decision (the
``sglang-cache-aware`` plugin; ``cache_aware_scored`` the earlier imitation); both run without
the gateway's dispatch order (sglang-router has none). The others
run with the dispatch order as shipped, which holds a request whose prefix an unanswered
request still computes on its instance until that one's first byte, for at most
``--follow-ms`` (the gateway's ``dispatch_follow_ms``; :mod:`services.common.admission.follow`);
a profile named ``NAME+nofollow`` is NAME without that follower rule; ``NAME+protect`` and
``NAME+slack`` are NAME with the dispatch order's protection
(:mod:`services.common.admission.protect`; ``guard`` and ``slack``), bounded by
``--protect-ms`` (the agent class's ``starve_after_ms``); ``NAME+auto`` is NAME with ``guard``
only while the fleet is overloaded: at least ``--protect-when-missed`` of the recent offers
were predicted to miss their TTFT deadline (the gateway's ``dispatch_protect: auto``).
``NAME+inflight`` is NAME deciding on its own in-flight counts, as sglang-router does: the
engines' loads as they change, and a request's end learnt ``--inflight-end-lag-ms`` after its
last step (``cache_aware+inflight`` matches more live cells than ``cache_aware``; results
page, "The load signal it decides on").

    .venv/bin/python benchmarks/goodput_sim.py --out /tmp/goodput_sim.json   # ~6 min, one core

Prints one JSON object (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _goodput_ceiling import CeilingRequest, ceiling_of  # noqa: E402
from _harness import MOONCAKE_CONVERSATION, TRACES, emit_json  # noqa: E402

from services.common.admission.shaper_config import (  # noqa: E402
    DISPATCH_FOLLOW_MS,
    DISPATCH_PROTECT_WHEN_MISSED,
)
from services.common.bench.traces import Trace, load_trace  # noqa: E402
from services.common.routing.config import DEFAULT_PROFILES_PATH  # noqa: E402
from services.sim import SimConfig, SimRun, simulate  # noqa: E402

AGENTIC = TRACES / "weka_agentic_dev.jsonl"
# the candidate profile: `default` plus slo-goodput
CANDIDATE_PLUGIN = {"name": "goodput", "type": "slo-goodput", "params": {}}
CANDIDATE_PROFILE = {
    "description": "default plus slo-goodput: P(meet TTFT and TPOT) per endpoint",
    "prefill_profile": "default-prefill",
    "plugins": [
        "guard",
        {"ref": "prefix", "weight": 6},
        {"ref": "ttft", "weight": 4},
        {"ref": "load", "weight": 1},
        {"ref": "home", "weight": 2},
        {"ref": "session-load", "weight": 4},
        {"ref": "goodput", "weight": 4},
        "pd",
    ],
}
BASELINES = ("cache_aware", "cache_aware_scored", "round_robin", "least_load", "power_of_two")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--agentic-trace", default=str(AGENTIC))
    p.add_argument(
        "--agentic-windows", default="0,574,1148,1722,2296,2870",
        help="request offsets of the agentic slices (default: 6 disjoint windows)",
    )  # fmt: skip
    p.add_argument("--agentic-requests", type=int, default=574, help="requests per slice")
    p.add_argument("--agentic-rates", default="0.5,1", help="rate scales of the agentic cells")
    p.add_argument("--conv-trace", default=str(MOONCAKE_CONVERSATION))
    p.add_argument("--conv-windows", default="2000,6000,10000", help="request offsets")
    p.add_argument("--conv-requests", type=int, default=400)
    p.add_argument("--conv-rates", default="2.5", help="rate scales of the conversation cells")
    p.add_argument("--profiles", default="default,goodput,cache_aware")
    p.add_argument("--profiles-file", default=None, help="default: shipped + the candidate")
    p.add_argument("--goodput-weight", type=float, default=None, help="candidate's weight")
    p.add_argument("--goodput-params", default="{}", help="candidate's params (YAML mapping)")
    p.add_argument("--engines", type=int, default=8)
    p.add_argument(
        "--gateways",
        type=int,
        default=1,
        help="gateway replicas, each with its own view (no shared state)",
    )
    p.add_argument("--scrape-queue-estimate", action="store_true",
                   help="the gateways price waiting requests they did not send")  # fmt: skip
    p.add_argument("--follow-ms", type=float, default=DISPATCH_FOLLOW_MS,
                   help="dispatch_follow_ms of the profiles but NAME+nofollow "
                   "(default: the gateway's)")  # fmt: skip
    p.add_argument("--protect-ms", type=float, default=10_000.0,
                   help="NAME+protect: protection's bound (default: the agent class's "
                   "starve_after_ms)")  # fmt: skip
    p.add_argument("--protect-when-missed", type=float, default=DISPATCH_PROTECT_WHEN_MISSED,
                   help="NAME+auto: the share of offers predicted late that turns protection "
                   "on (default: the gateway's)")  # fmt: skip
    p.add_argument("--inflight-end-lag-ms", type=float, default=20.0,
                   help="NAME+inflight: how long after a request's last step its end is "
                   "learnt (default 20)")  # fmt: skip
    p.add_argument("--engine-profile", default="h200-llama3.1-8b")
    p.add_argument("--engine-slowdown", type=float, default=1.2)
    p.add_argument("--kv-blocks", type=int, default=16384)
    p.add_argument("--stream-interval", type=int, default=16)
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=100.0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def profiles_file(a: argparse.Namespace, tmp: Path) -> str:
    """The shipped profiles plus the candidate (unless shipped), written to ``tmp``."""
    if a.profiles_file:
        return str(a.profiles_file)
    doc = yaml.safe_load(DEFAULT_PROFILES_PATH.read_text(encoding="utf-8"))
    if "goodput" not in doc["profiles"]:
        plugin = {**CANDIDATE_PLUGIN, "params": yaml.safe_load(a.goodput_params) or {}}
        doc["plugins"].append(plugin)
        prof = {**CANDIDATE_PROFILE, "plugins": list(CANDIDATE_PROFILE["plugins"])}
        doc["profiles"]["goodput"] = prof
    if a.goodput_weight is not None:
        for ref in doc["profiles"]["goodput"]["plugins"]:
            if isinstance(ref, dict) and ref.get("ref") == "goodput":
                ref["weight"] = a.goodput_weight
    path = tmp / "profiles.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return str(path)


def ceiling(run: SimRun, cfg: SimConfig) -> dict[str, Any]:
    """The share of requests no router could serve within the TTFT SLO (module doc)."""
    reqs = (CeilingRequest(r.arrival, r.view.prompt_tokens, r.view.block_hashes)
            for r in run.requests)  # fmt: skip
    return ceiling_of(
        reqs, engine_profile=cfg.engine_profile, stream_interval=cfg.stream_interval,
        block_size=cfg.block_size, slo_ttft_ms=cfg.slo_ttft_ms or 0.0,
    )  # fmt: skip


def cell_figures(doc: dict[str, Any]) -> dict[str, Any]:
    ttft, tpot = doc.get("ttft_ms") or {}, doc.get("tpot_ms") or {}
    return {
        "goodput_rps": doc.get("goodput_rps"),
        "slo_attainment": doc.get("slo_attainment"),
        # goodput = requests meeting both SLOs / duration (the last completion): at 0.5x,
        # where attainment differs by a few %, the duration (the slowest instance's last
        # long decodes) often decides the ratio
        "duration_s": doc.get("duration_s"),
        "ttft_mean_ms": ttft.get("mean"),
        "ttft_p90_ms": ttft.get("p90"),
        "tpot_mean_ms": tpot.get("mean"),
        "cache_hit_ratio": doc.get("cache_hit_ratio"),
        "failed": doc.get("failed"),
    }


def run_cell(
    a: argparse.Namespace, trace: Trace, offset: int, n: int, rate: float, pfile: str
) -> dict[str, Any]:
    cell: dict[str, Any] = {"trace": Path(trace.path).name, "offset": offset, "requests": n,
                            "rate_scale": rate, "profiles": {}}  # fmt: skip
    for profile in [x.strip() for x in a.profiles.split(",") if x.strip()]:
        name, _, variant = profile.partition("+")
        if variant not in ("", "nofollow", "protect", "slack", "auto", "inflight"):
            raise SystemExit(
                f"unknown profile variant {variant!r} "
                "(known: nofollow, protect, slack, auto, inflight)"
            )
        inflight = variant == "inflight"
        cfg = SimConfig(
            engines=a.engines, gateways=a.gateways, profile=name, profiles_file=pfile,
            scrape_queue_estimate=a.scrape_queue_estimate,
            engine_profile=f"{a.engine_profile}*{a.engine_slowdown:g}",
            gateway_perf_profile=a.engine_profile, rate_scale=rate, max_requests=n,
            offset=offset, kv_blocks=a.kv_blocks, stream_interval=a.stream_interval,
            slo_ttft_ms=a.slo_ttft_ms, slo_tpot_ms=a.slo_tpot_ms, keep_block_hashes=True,
            shaper_follow_ms=0.0 if variant == "nofollow" else a.follow_ms,
            shaper_protect_ms=a.protect_ms if variant in ("protect", "slack", "auto") else 0.0,
            shaper_protect_slack=variant == "slack",
            shaper_protect_when_missed=a.protect_when_missed if variant == "auto" else 0.0,
            load_source="stream" if inflight else "scrape",
            end_lag_ms=a.inflight_end_lag_ms if inflight else 0.0,
            **({"shaper_hold_ms": 0.0} if name in BASELINES else {}),
        )  # fmt: skip
        doc, run = simulate(cfg, trace)
        cell["profiles"][profile] = cell_figures(doc)
        if "ceiling" not in cell:
            cell["ceiling"] = ceiling(run, cfg)
        print(f"{cell['trace']} @{offset} x{rate:g} {profile}: {cell['profiles'][profile]}",
              file=sys.stderr, flush=True)  # fmt: skip
    return cell


def ratios(cells: list[dict[str, Any]], ours: str, base: str) -> dict[str, Any]:
    """Per-cell ratios ours / base (goodput, TTFT mean, TPOT mean) and their means."""
    out: dict[str, list[float]] = {"goodput": [], "ttft_mean": [], "tpot_mean": []}
    for c in cells:
        me, b = c["profiles"].get(ours), c["profiles"].get(base)
        if not me or not b:
            continue
        for key, metric in (("goodput", "goodput_rps"), ("ttft_mean", "ttft_mean_ms"),
                            ("tpot_mean", "tpot_mean_ms")):  # fmt: skip
            if me.get(metric) and b.get(metric):
                out[key].append(me[metric] / b[metric])
    return {
        k: {"mean": round(sum(v) / len(v), 3), "min": round(min(v), 3), "max": round(max(v), 3)}
        for k, v in out.items()
        if v
    }


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    started = time.perf_counter()
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="goodput-sim-") as tmp:
        pfile = profiles_file(a, Path(tmp))
        profiles_doc = yaml.safe_load(Path(pfile).read_text(encoding="utf-8"))
        plan = [(a.agentic_trace, a.agentic_windows, a.agentic_requests, a.agentic_rates),
                (a.conv_trace, a.conv_windows, a.conv_requests, a.conv_rates)]  # fmt: skip
        for path, windows, n, rates in plan:
            trace = load_trace(path)
            for rate in [float(x) for x in rates.split(",") if x.strip()]:
                for off in [int(x) for x in windows.split(",") if x.strip()]:
                    cells.append(run_cell(a, trace, off, n, rate, pfile))
    names = [x.strip() for x in a.profiles.split(",") if x.strip()]
    out = {
        "tool": "goodput_sim (virtual time)",
        "args": vars(a),
        "goodput_profile": profiles_doc["profiles"].get("goodput"),
        "goodput_plugin": next(
            (p for p in profiles_doc["plugins"] if p.get("type") == "slo-goodput"), None
        ),
        "cells": cells,
        "ratios_vs_cache_aware": {
            p: ratios(cells, p, "cache_aware") for p in names if p != "cache_aware"
        },
        "ratios_goodput_vs_default": ratios(cells, "goodput", "default"),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    emit_json(out, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
