"""Why one profile's TPOT is higher than another's on one cell, per request and instance, in
virtual time.

Runs the cell (as ``goodput_sim.py`` does: ``--engine-slowdown`` times slower engines than the
gateway's profile, the SLO as the requests' targets) under each profile and, per profile:
the TPOT mean; the decode concurrency each request saw (the mean number of other requests
decoding on its instance over its decode, time-weighted); the prefill it sat through (the
uncached prompt tokens of other requests on its instance whose prefill ended during its
decode: chunked prefill batches those chunks with its decode steps); and the long uncached
prefills (at least ``--long-tokens``) with the number of decodes running on their instance
when they ended. For the first and last profile: the mean per-request TPOT difference and
the share of it carried by the ``--top`` requests that differ most; the requests that meet
both SLOs under one and not the other, by the instance that served them; and the first
``--top`` requests the two placed on different instances (where the placements diverge).

    .venv/bin/python benchmarks/tpot_stalls.py --offset 287 --rate 1 \\
        --profiles default,cache_aware            # a few seconds

Prints one JSON object (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import statistics as st
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import goodput_sim  # noqa: E402
from _harness import emit_json  # noqa: E402

from services.common.bench.traces import load_trace  # noqa: E402
from services.sim import SimConfig, simulate  # noqa: E402
from services.sim.records import SimRequest  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--conv", action="store_true", help="the conversation trace (else agentic)")
    p.add_argument("--offset", type=int, default=287)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--rate", type=float, default=1.0)
    p.add_argument("--profiles", default="default,cache_aware")
    p.add_argument("--profiles-file", default=None, help="default: goodput_sim.py's")
    p.add_argument("--long-tokens", type=int, default=40_000)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def decoded(run_requests: list[SimRequest]) -> list[SimRequest]:
    return [r for r in run_requests if r.first is not None and r.last is not None and r.ntok > 1]


def per_request(reqs: list[SimRequest]) -> dict[int, dict[str, float]]:
    """Per request: TPOT, decode concurrency, prefill tokens sat through (module doc)."""
    by_inst: dict[str, list[SimRequest]] = {}
    for r in reqs:
        by_inst.setdefault(r.home, []).append(r)
    out = {}
    for r in reqs:
        first, last = r.first or 0.0, r.last or 0.0
        span = last - first
        peers = [q for q in by_inst[r.home] if q is not r]
        overlap = sum(
            max(0.0, min(last, q.last or 0.0) - max(first, q.first or 0.0)) for q in peers
        )
        pf = sum(q.prompt_tokens - q.cached for q in peers
                 if q.prefilled_at is not None and first <= q.prefilled_at <= last)  # fmt: skip
        out[r.index] = {"tpot": span / (r.ntok - 1), "conc": overlap / span if span > 0 else 0.0,
                        "pf": float(pf)}  # fmt: skip
    return out


def long_prefills(reqs: list[SimRequest], long_tokens: int) -> dict[str, Any]:
    """Long uncached prefills and the decodes on their instance when they ended."""
    dec = decoded(reqs)
    rows = []
    for r in reqs:
        if r.prefilled_at is None or r.prompt_tokens - r.cached < long_tokens:
            continue
        t = r.prefilled_at
        n = sum(
            1
            for q in dec
            if q is not r and q.home == r.home and (q.first or 0) <= t <= (q.last or 0)
        )
        rows.append(n)
    return {"count": len(rows), "decodes_running_sum": sum(rows)}


def meets_slo(r: SimRequest, ttft_ms: float, tpot_ms: float) -> bool:
    """Both SLOs met: first token within ``ttft_ms`` and (if it decoded) mean TPOT within."""
    if r.first is None or r.error is not None or r.first - r.arrival > ttft_ms:
        return False
    return r.ntok <= 1 or ((r.last or r.first) - r.first) / (r.ntok - 1) <= tpot_ms


def placements(a: list[SimRequest], b: list[SimRequest], g: Any, top: int) -> dict[str, Any]:
    """Requests meeting both SLOs under ``a`` only / ``b`` only (by ``b``'s instance), and the
    first ``top`` requests placed on different instances."""
    ra, rb = {r.index: r for r in a}, {r.index: r for r in b}
    common = sorted(set(ra) & set(rb))
    ok_a = {i for i in common if meets_slo(ra[i], g.slo_ttft_ms, g.slo_tpot_ms)}
    ok_b = {i for i in common if meets_slo(rb[i], g.slo_ttft_ms, g.slo_tpot_ms)}
    by_inst: dict[str, int] = {}
    for i in sorted(ok_a - ok_b):
        by_inst[rb[i].home] = by_inst.get(rb[i].home, 0) + 1
    moved = [
        {"index": i, "arrival_s": round(ra[i].arrival / 1000, 1), "prompt": ra[i].prompt_tokens,
         "cached": [ra[i].cached, rb[i].cached], "instance": [ra[i].home, rb[i].home]}
        for i in common if ra[i].home != rb[i].home
    ][:top]  # fmt: skip
    return {"met_first_only": len(ok_a - ok_b), "met_last_only": len(ok_b - ok_a),
            "met_first_only_by_last_instance": dict(sorted(by_inst.items())),
            "first_moved": moved}  # fmt: skip


def profile_figures(reqs: list[SimRequest], long_tokens: int) -> dict[str, Any]:
    pr = per_request(decoded(reqs))
    vals = list(pr.values())
    served: dict[str, int] = {}
    for r in reqs:
        served[r.home] = served.get(r.home, 0) + 1
    return {
        "requests": len(vals),
        "served_per_instance": dict(sorted(served.items())),
        "tpot_mean_ms": round(st.mean(v["tpot"] for v in vals), 1),
        "decode_concurrency_mean": round(st.mean(v["conc"] for v in vals), 2),
        "prefill_sat_through_mean_tokens": round(st.mean(v["pf"] for v in vals)),
        "long_prefills": long_prefills(reqs, long_tokens),
    }


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    g = goodput_sim.parse_args([])
    trace = load_trace(g.conv_trace if a.conv else g.agentic_trace)
    names = [x.strip() for x in a.profiles.split(",") if x.strip()]
    runs: dict[str, list[SimRequest]] = {}
    with tempfile.TemporaryDirectory(prefix="tpot-stalls-") as tmp:
        pfile = a.profiles_file or goodput_sim.profiles_file(g, Path(tmp))
        for name in names:
            cfg = SimConfig(
                engines=g.engines, profile=name, profiles_file=pfile,
                engine_profile=f"{g.engine_profile}*{g.engine_slowdown:g}",
                gateway_perf_profile=g.engine_profile, rate_scale=a.rate,
                max_requests=a.requests, offset=a.offset, kv_blocks=g.kv_blocks,
                stream_interval=g.stream_interval, slo_ttft_ms=g.slo_ttft_ms,
                slo_tpot_ms=g.slo_tpot_ms, shaper_follow_ms=g.follow_ms,
                **({"shaper_hold_ms": 0.0} if name in goodput_sim.BASELINES else {}),
            )  # fmt: skip
            _, run = simulate(cfg, trace)
            runs[name] = run.requests
    out: dict[str, Any] = {
        "tool": "tpot_stalls (virtual time)", "args": vars(a),
        "profiles": {n: profile_figures(r, a.long_tokens) for n, r in runs.items()},
    }  # fmt: skip
    if len(names) >= 2:
        first, last = per_request(decoded(runs[names[0]])), per_request(decoded(runs[names[-1]]))
        common = sorted(set(first) & set(last))
        diffs = sorted((first[k]["tpot"] - last[k]["tpot"] for k in common), reverse=True)
        out["difference"] = {
            "profiles": [names[0], names[-1]], "requests": len(common),
            "mean_tpot_diff_ms": round(sum(diffs) / len(common), 2),
            f"top_{a.top}_share_ms": round(sum(diffs[: a.top]) / len(common), 2),
            **placements(runs[names[0]], runs[names[-1]], g, a.top),
        }  # fmt: skip
    emit_json(out, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
