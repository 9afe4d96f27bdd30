"""A run's results in the JSON of ``tideserve bench`` (pure), so a live run and a simulated
one compare key by key.

The figures are the bench's own: every simulated request becomes a
:class:`services.common.bench.stats.RequestResult` (modelled seconds instead of wall seconds) and
:func:`services.common.bench.stats.summarize` computes the summary, with the bench's extra keys
beside it (``infinite_cache_hit_ratio``, ``targets``, ``trace``, ``config``, ...). A
request's first token is the engines' first streamed chunk (``stream_interval`` tokens), as
the bench sees it live. ``time_base`` is ``"model"``: the engines' modelled time.

The bench's two wall-clock keys (``wall_duration_s``, ``cpu``) are not figures of the
simulated system; the simulator's own wall-clock facts go under ``"wall"`` (the only
key that differs between two runs of the same inputs), and what only a simulation can tell
(routing diagnostics, requests per instance, events) under ``"sim"``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any

from services.common.bench.stats import RequestResult, infinite_cache_hit_ratio, summarize
from services.sim.records import SimRequest
from services.sim.run import SimRun

__all__ = ["BENCH_WALL_KEYS", "SIM_KEYS", "request_results", "summary"]

BENCH_WALL_KEYS: tuple[str, ...] = ("wall_duration_s", "cpu")
"""The bench's keys about the machine's clock; the simulator reports those under "wall"."""
SIM_KEYS: tuple[str, ...] = ("sim", "wall")
"""The simulator's keys that a bench summary does not have."""


def request_result(r: SimRequest, trace_input: int) -> RequestResult:
    """One request as the bench records it (seconds of modelled time)."""
    at = r.arrival / 1000.0
    if r.error is not None or r.first is None or r.last is None:
        return RequestResult(
            r.index, r.target, at, at, trace_input, r.out, error=r.error or "unfinished"
        )
    first, last = r.first / 1000.0, r.last / 1000.0
    return RequestResult(
        index=r.index,
        target=r.target,
        scheduled_s=at,
        sent_s=at,
        input_length=trace_input,
        output_length=r.out,
        ttft_s=first - at,
        tpot_s=(last - first) / (r.ntok - 1) if r.ntok > 1 else None,
        e2e_s=last - at,
        output_tokens=r.ntok,
        prompt_tokens=r.prompt_tokens,
        cached_tokens=r.cached,
    )


def request_results(run: SimRun) -> list[RequestResult]:
    return [
        request_result(r, tr.input_length)
        for r, (_, tr) in zip(run.requests, run.arrivals, strict=True)
    ]


def summary(run: SimRun, *, wall_s: float, cpu_s: float) -> dict[str, Any]:
    """The bench-shaped summary of ``run``; ``wall_s``/``cpu_s``: what the run cost."""
    cfg = run.config
    results = request_results(run)
    ends = [r.last for r in run.requests if r.last is not None]
    duration_s = max(ends) / 1000.0 if ends else 0.0
    out = summarize(
        results, duration_s=duration_s, slo_ttft_ms=cfg.slo_ttft_ms, slo_tpot_ms=cfg.slo_tpot_ms
    )
    per_target: dict[str, Counter[str]] = {i.iid: Counter() for i in run.engines}
    for res in results:
        if res.target:
            per_target[res.target]["completed" if res.ok else "failed"] += 1
    replayed = [tr for _, tr in run.arrivals]
    n = max(1, len(replayed))
    out.update(
        {
            "infinite_cache_hit_ratio": infinite_cache_hit_ratio(replayed, run.trace.block_tokens),
            "not_sent": 0,
            "output_length_mismatch": sum(
                1 for r in results if r.ok and r.output_tokens != max(1, r.output_length)
            ),
            "time_base": "model",
            "targets": {t: dict(c) for t, c in per_target.items()},
            "trace": {
                "path": run.trace.path,
                "format": run.trace.format,
                "requests_in_file": len(run.trace.requests),
                "requests_replayed": len(replayed),
                "span_s": round(replayed[-1].arrival_s - replayed[0].arrival_s, 3)
                if replayed
                else 0.0,
                "mean_input_tokens": round(sum(r.input_length for r in replayed) / n, 1),
                "mean_output_tokens": round(sum(r.output_length for r in replayed) / n, 1),
            },
            "config": asdict(cfg),
            "sim": sim_section(run),
            "wall": {
                "duration_s": round(wall_s, 3),
                "cpu_s": round(cpu_s, 3),
                "requests_per_s": round(len(results) / wall_s, 1) if wall_s > 0 else None,
            },
        }
    )
    return out


def sim_section(run: SimRun) -> dict[str, Any]:
    """What only the simulator knows: the fleet, routing diagnostics, the loop's work."""
    g = run.diag
    spread = Counter(r.target for r in run.requests if r.target)
    return {
        "replicas": run.engines.roles(),
        "gateways": run.config.gateways,
        "requests_per_instance": [spread.get(i.iid, 0) for i in run.engines],
        "routing": {
            "picks": g.picks,
            "disaggregated": g.disaggregated,
            "with_routed_prefix": g.with_prefix,
            "kept_best_prefix": g.kept_best,
            "lost_prefix_blocks": g.lost_blocks,
            "best_routed_prefix_tokens": g.best_blocks * run.config.block_size,
            "predicted_cached_tokens": g.predicted_cached,
            "lost_to_top_scorer": dict(sorted(g.reasons.items())),
        },
        "mean_held_ms": round(g.held_ms / max(1, g.picks), 3),
        "events": run.events,
        "autoscale": run.autoscale,
        "agent_memory": run.agent_memory,
        "failure": run.failure.summary() if run.failure is not None else None,
        "scale_in": [
            {"instance": r.iid, "chosen_s": round(r.chosen_ms / 1000.0, 3),
             "removed_s": None if r.removed_ms is None else round(r.removed_ms / 1000.0, 3),
             "active_sessions": len(r.sessions), "prefix_blocks": r.prefix_blocks,
             "kept_blocks": r.kept_blocks, "kept_unmigrated_blocks": r.kept_unmigrated_blocks}
            for r in run.scale_ins
        ] or None,
    }  # fmt: skip
