"""Benchmark statistics (pure): per-request results in, the stable summary JSON out.

Summary keys other tools parse (stable): ``completed``, ``failed``, ``duration_s``,
``request_throughput_rps``, ``output_token_throughput``, ``ttft_ms``, ``tpot_ms``, ``e2e_ms``
(each ``{"mean", "p50", "p90", "p99"}``, values None when there is no sample),
``cache_hit_ratio``, ``goodput_rps``, ``slo_attainment``. Extras: ``errors`` (reason →
count), ``output_tokens``, ``prompt_tokens``, ``cached_tokens``, ``client_queue_ms``.

Definitions:
* TTFT: send → first streamed token; TPOT: (last token - first token) / (tokens - 1), per
  request, only for requests with at least 2 tokens; e2e: send → end of stream.
* ``cache_hit_ratio`` = Σ cached prompt tokens / Σ prompt tokens over completed requests
  whose usage reports prompt tokens (None when none does).
* A request meets the SLOs when it completed, its TTFT <= ``slo_ttft_ms`` and its TPOT <=
  ``slo_tpot_ms`` (an unset SLO always holds; a request without a TPOT meets the TPOT SLO).
  ``goodput_rps`` = such requests / duration; ``slo_attainment`` = such requests / all sent.
* ``time_scale`` multiplies every latency and the duration (throughputs divide by it): use
  the engines' speedup to report figures in trace time when the targets run time faster.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.common.bench.traces import TraceRequest

QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))


@dataclass(frozen=True, slots=True)
class RequestResult:
    """The client-side outcome of one request (times in wall-clock seconds).

    ``scheduled_s``/``sent_s`` are relative to the start of the run; ``error`` is None on
    success. Latencies are None when not measured (e.g. failed before the first token).
    """

    index: int
    target: str
    scheduled_s: float
    sent_s: float
    input_length: int
    output_length: int
    error: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of an ascending, non-empty sequence (q in [0, 1])."""
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def distribution(values: Iterable[float]) -> dict[str, float | None]:
    """``{"mean", "p50", "p90", "p99"}`` of ``values`` (all None when empty), rounded to µs."""
    vals = sorted(values)
    if not vals:
        return {"mean": None, **{name: None for name, _ in QUANTILES}}
    out: dict[str, float | None] = {"mean": round(sum(vals) / len(vals), 3)}
    for name, q in QUANTILES:
        out[name] = round(percentile(vals, q), 3)
    return out


def meets_slo(r: RequestResult, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> bool:
    """True when ``r`` completed within both SLOs (unscaled wall-clock times)."""
    if not r.ok or r.ttft_s is None:
        return False
    if slo_ttft_ms is not None and r.ttft_s * 1000.0 > slo_ttft_ms:
        return False
    return not (
        slo_tpot_ms is not None and r.tpot_s is not None and r.tpot_s * 1000.0 > slo_tpot_ms
    )


def infinite_cache_hit_ratio(
    requests: Sequence[TraceRequest], block_tokens: int = 512
) -> float | None:
    """Best possible prefix reuse of a trace slice: an unbounded cache shared by all targets.

    For each request, the leading blocks whose hash ids appeared in an earlier request are
    hits (an id names its whole prefix); a hit block counts its tokens in this request.
    Returns Σ hit tokens / Σ input tokens, 0.0 for traces without hash ids, None if empty.
    """
    total = sum(r.input_length for r in requests)
    if total == 0:
        return None
    seen: set[int] = set()
    hit = 0
    for r in requests:
        if r.hash_ids is None:
            continue
        matched = 0
        for h in r.hash_ids:
            if h not in seen:
                break
            matched += 1
        hit += min(matched * block_tokens, r.input_length)
        seen.update(r.hash_ids)
    return round(hit / total, 6)


def _wall_slos(
    slo_ttft_ms: float | None, slo_tpot_ms: float | None, time_scale: float
) -> tuple[float | None, float | None]:
    """SLOs given in reported units, in wall-clock ms (what :func:`meets_slo` checks)."""
    if time_scale <= 0:
        raise ValueError(f"time_scale must be positive, got {time_scale}")
    return (
        None if slo_ttft_ms is None else slo_ttft_ms / time_scale,
        None if slo_tpot_ms is None else slo_tpot_ms / time_scale,
    )


def summarize(
    results: Sequence[RequestResult],
    *,
    duration_s: float,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    time_scale: float = 1.0,
) -> dict[str, Any]:
    """The summary dict (stable keys; see module docstring). SLOs are in reported units."""
    wall_ttft, wall_tpot = _wall_slos(slo_ttft_ms, slo_tpot_ms, time_scale)
    ok = [r for r in results if r.ok]
    failed = len(results) - len(ok)
    dur = max(duration_s, 0.0) * time_scale
    ms = 1000.0 * time_scale

    def rate(n: float) -> float:
        return round(n / dur, 6) if dur > 0 else 0.0

    good = sum(1 for r in ok if meets_slo(r, wall_ttft, wall_tpot))
    out_tokens = sum(r.output_tokens for r in ok)
    with_usage = [r for r in ok if r.prompt_tokens]
    prompt_tokens = sum(r.prompt_tokens or 0 for r in with_usage)
    cached_tokens = sum(r.cached_tokens or 0 for r in with_usage)
    errors = Counter(r.error for r in results if r.error is not None)
    return {
        "completed": len(ok),
        "failed": failed,
        "duration_s": round(dur, 6),
        "request_throughput_rps": rate(len(ok)),
        "output_token_throughput": rate(out_tokens),
        "ttft_ms": distribution(r.ttft_s * ms for r in ok if r.ttft_s is not None),
        "tpot_ms": distribution(r.tpot_s * ms for r in ok if r.tpot_s is not None),
        "e2e_ms": distribution(r.e2e_s * ms for r in ok if r.e2e_s is not None),
        "cache_hit_ratio": round(cached_tokens / prompt_tokens, 6) if prompt_tokens else None,
        "goodput_rps": rate(good),
        "slo_attainment": round(good / len(results), 6) if results else None,
        "slo": {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_tpot_ms, "met": good},
        "output_tokens": out_tokens,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "client_queue_ms": distribution(max(0.0, r.sent_s - r.scheduled_s) * ms for r in results),
        "errors": dict(errors.most_common()),
    }


def request_records(
    results: Sequence[RequestResult],
    *,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    time_scale: float = 1.0,
) -> list[dict[str, Any]]:
    """One record per request, as ``summarize`` counts it (times in reported units, ms).

    Keys: ``index`` (the request's position in the trace's arrival order), ``target``,
    ``scheduled_ms`` and ``sent_ms`` (from the run's start), ``input_length``,
    ``output_length``, ``ttft_ms``, ``tpot_ms``, ``e2e_ms`` (None when not measured),
    ``output_tokens``, ``prompt_tokens``, ``cached_tokens``, ``met_slo`` and ``error``.
    """
    wall_ttft, wall_tpot = _wall_slos(slo_ttft_ms, slo_tpot_ms, time_scale)
    ms = 1000.0 * time_scale

    def scaled(v: float | None) -> float | None:
        return None if v is None else round(v * ms, 3)

    return [
        {
            "index": r.index,
            "target": r.target,
            "scheduled_ms": scaled(r.scheduled_s),
            "sent_ms": scaled(r.sent_s),
            "input_length": r.input_length,
            "output_length": r.output_length,
            "ttft_ms": scaled(r.ttft_s),
            "tpot_ms": scaled(r.tpot_s),
            "e2e_ms": scaled(r.e2e_s),
            "output_tokens": r.output_tokens,
            "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens,
            "met_slo": meets_slo(r, wall_ttft, wall_tpot),
            "error": r.error,
        }
        for r in sorted(results, key=lambda r: r.index)
    ]


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def markdown_table(summary: Mapping[str, Any]) -> str:
    """A Markdown rendering of a summary (headline figures, then a latency table)."""
    rows = [
        ("completed", summary.get("completed")),
        ("failed", summary.get("failed")),
        ("duration (s)", summary.get("duration_s")),
        ("request throughput (req/s)", summary.get("request_throughput_rps")),
        ("output token throughput (tok/s)", summary.get("output_token_throughput")),
        ("goodput (req/s)", summary.get("goodput_rps")),
        ("SLO attainment", summary.get("slo_attainment")),
        ("cache hit ratio", summary.get("cache_hit_ratio")),
        ("infinite-cache hit ratio", summary.get("infinite_cache_hit_ratio")),
    ]
    cpu = summary.get("cpu")
    if isinstance(cpu, Mapping):
        rows.append(("CPU saturated", cpu.get("saturated")))
    lines = ["| metric | value |", "|---|---|"]
    lines += [f"| {name} | {_fmt(v)} |" for name, v in rows]
    lines += ["", "| latency (ms) | mean | p50 | p90 | p99 |", "|---|---|---|---|---|"]
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
        d = summary.get(key) or {}
        cells = " | ".join(_fmt(d.get(k)) for k in ("mean", "p50", "p90", "p99"))
        lines.append(f"| {label} | {cells} |")
    return "\n".join(lines) + "\n"
