"""``tideserve sim --profile a,b,c``: routing profiles side by side, each on a fresh fleet.

Every profile runs the same trace, fleet, engines and seed from empty caches; the JSON
holds each profile's bench-shaped summary under ``profiles`` and a ``comparison`` row per
profile (TTFT and TPOT mean/p90, goodput, SLO attainment, hit ratio, and the ratios to the
first profile listed). Profiles that stand in for another router (``--baseline-profiles``,
by default the imitations of sglang-router's policies) run without the gateway's dispatch
order, as that router has none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from services.sim.config import SimConfig

__all__ = ["BASELINES", "comparison_rows", "profile_config", "table"]

BASELINES = ("cache_aware", "cache_aware_scored", "round_robin", "least_load", "power_of_two")
"""The shipped profiles that imitate sglang-router's policies."""


def profile_config(base: SimConfig, profile: str, baselines: Sequence[str]) -> SimConfig:
    """``base`` with ``profile``; a baseline without the dispatch order."""
    cfg = replace(base, profile=profile)
    return replace(cfg, shaper_hold_ms=0.0) if profile in baselines else cfg


def _get(doc: Mapping[str, Any], key: str, q: str = "") -> float | None:
    v = doc.get(key)
    if q:
        v = v.get(q) if isinstance(v, Mapping) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def comparison_rows(docs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per profile, in order, with its ratios to the first profile's figures."""
    rows: list[dict[str, Any]] = []
    first: dict[str, Any] | None = None
    for name, doc in docs.items():
        row: dict[str, Any] = {
            "profile": name,
            "ttft_mean_ms": _get(doc, "ttft_ms", "mean"),
            "ttft_p90_ms": _get(doc, "ttft_ms", "p90"),
            "tpot_mean_ms": _get(doc, "tpot_ms", "mean"),
            "tpot_p90_ms": _get(doc, "tpot_ms", "p90"),
            "goodput_rps": _get(doc, "goodput_rps"),
            "slo_attainment": _get(doc, "slo_attainment"),
            "cache_hit_ratio": _get(doc, "cache_hit_ratio"),
            "failed": int(doc.get("failed") or 0),
        }
        first = first or row
        for key in ("ttft_mean_ms", "ttft_p90_ms", "tpot_mean_ms", "goodput_rps"):
            row[f"{key}_vs_{first['profile']}"] = _ratio(row[key], first[key])
        rows.append(row)
    return rows


def _cell(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a text table (times in ms)."""
    head = (
        f"{'profile':<14} {'TTFT mean':>10} {'TTFT p90':>10} {'TPOT mean':>10} "
        f"{'goodput':>8} {'attain':>7} {'hit':>6} {'failed':>6}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['profile']:<14} {_cell(r['ttft_mean_ms'], '10.0f')} "
            f"{_cell(r['ttft_p90_ms'], '10.0f')} {_cell(r['tpot_mean_ms'], '10.1f')} "
            f"{_cell(r['goodput_rps'], '8.3f')} {_cell(r['slo_attainment'], '7.3f')} "
            f"{_cell(r['cache_hit_ratio'], '6.3f')} {r['failed']:>6}"
        )
    return "\n".join(lines)
