"""Statistics of `routing_sim.py` runs: routing diagnostics, distributions and where the
time to first token goes (pure functions over the simulator's records)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from services.common.perfmodel import PerfProfile
from services.sim.records import Diag

FIDELITY_TOLERANCE = 0.10  # the simulator's target: within 10 % of the live stack


def gap_summary(gaps: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """Simulated-against-live gaps (sim / live - 1) summed up: the largest either way, the
    mean absolute, and how many are within :data:`FIDELITY_TOLERANCE` out of how many."""
    return {
        "max_abs_gap": round(max(abs(g) for g in gaps), digits),
        "mean_abs_gap": round(sum(abs(g) for g in gaps) / len(gaps), digits),
        "within_10pct": sum(1 for g in gaps if abs(g) <= FIDELITY_TOLERANCE),
        "of": len(gaps),
    }


def time_split(
    done: Sequence[Any], perf: PerfProfile, g: Diag, dur_s: float, engines: int
) -> dict[str, float]:
    """Where the mean TTFT goes, per completed request (ms, means): ``own_prefill`` =
    the model's prefill of the uncached suffix on an idle engine; ``wait`` = the rest up
    to the engine's first token (queueing ahead, and prefill slowed by sharing steps);
    ``first_chunk`` = from there to the first streamed chunk (the stream-interval decode
    steps, stretched by other prompts' prefill chunks); ``uncached_tokens`` = the
    prompt not served from cache. The engines' steps: share of decode-step time spent in
    steps that also carried prefill chunks (what stretches TPOT), the mean decode batch,
    and ``busy_share``: engine-time in steps / (engines x the run's duration)."""
    if not done:
        return {}
    own = wait = chunk = unc = 0.0
    for r in done:
        first, pre = float(r.first or 0.0), float(r.prefilled_at or r.first or 0.0)
        p = perf.prefill_ms(r.prompt_tokens - r.cached, r.cached)
        own += p
        wait += pre - r.arrival - p
        chunk += first - pre
        unc += r.prompt_tokens - r.cached
    n = len(done)
    return {
        "own_prefill": round(own / n, 1),
        "wait": round(wait / n, 1),
        "first_chunk": round(chunk / n, 1),
        "uncached_tokens": round(unc / n),
        "mixed_step_share": round(g.mixed_ms / g.step_ms, 3) if g.step_ms else 0.0,
        "mean_decode_batch": round(g.decode_seqs / g.steps, 2) if g.steps else 0.0,
        "busy_share": round(g.step_ms / (1000.0 * dur_s * engines), 3) if dur_s > 0 else 0.0,
    }


def by_turn(done: Sequence[Any], slo_ttft_ms: float, slo_tpot_ms: float) -> dict[str, Any]:
    """Completed requests split into continuations (the engine held at least half of the
    prompt) and the rest (new sessions' first turns, and turns that lost their KV): count,
    mean TTFT (ms) and how many met both SLOs. Tells whether a router's goodput comes from
    the turns that can meet a TTFT budget at all."""
    out: dict[str, Any] = {}
    for kind in ("continuation", "new"):
        rows = [r for r in done if (2 * r.cached >= r.prompt_tokens) == (kind == "continuation")]
        ttft = [float(r.first) - r.arrival for r in rows]
        good = 0
        for r, t in zip(rows, ttft, strict=True):
            tpot = (float(r.last) - float(r.first)) / (r.out - 1) if r.out > 1 else None
            good += t <= slo_ttft_ms and (tpot is None or tpot <= slo_tpot_ms)
        out[kind] = {
            "requests": len(rows),
            "ttft_mean_ms": round(statistics.fmean(ttft), 1) if ttft else None,
            "good": good,
        }
    return out


def dist(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None

    def q(f: float) -> float:
        return round(xs[min(len(xs) - 1, int(len(xs) * f))], 1)

    return {"mean": round(statistics.fmean(xs), 1), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99)}
