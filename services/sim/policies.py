"""``tideserve sim --autoscale-policy a,b,c``: autoscaling policies side by side (pure).

Each policy runs the same arrivals on a fresh fleet, started at the same size, with the
router and the engines in the loop:

- ``sla``: the autoscaler's SLA planner (``planner.policy: sla``);
- ``reactive``: the autoscaler's KPA-like policy (``planner.policy: reactive``,
  :mod:`services.common.planner.reactive`);
- ``static``: the starting fleet, never scaled.

Per policy: the SLO windows met (per ``window_s`` of modelled time, the requests that arrived
in it meet both targets at the percentile; a failed request misses both; a window without
requests is met), replica-seconds (the replicas at each timeline row's end times the row's
length) and their ratio to ``static``'s when it ran, peak replicas, and the bench's figures.
The shell (:mod:`services.sim.cli`) runs the simulations; nothing here does I/O.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from services.common.bench.stats import RequestResult, percentile
from services.sim.autoscale import AutoscaleConfig
from services.sim.config import SimConfig, SimConfigError

__all__ = [
    "POLICIES",
    "parse_policies",
    "policy_config",
    "policy_row",
    "policy_table",
    "replica_seconds",
    "slo_windows",
    "with_ratios",
]

POLICIES = ("sla", "reactive", "static")
FAILED_MS = 1e30
"""A failed request's TTFT and TPOT in a window: finite, as the interpolated percentile of
``inf`` values is NaN (``inf - inf``), which compares as met."""


def parse_policies(text: str) -> list[str]:
    """The comma list ``text`` as policies; raises ``SimConfigError`` for an unknown one."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in POLICIES]
    if bad or not names:
        raise SimConfigError(
            f"--autoscale-policy takes a comma list of {', '.join(POLICIES)}; got {text!r}"
        )
    if len(set(names)) != len(names):
        raise SimConfigError(f"--autoscale-policy names a policy twice: {text!r}")
    return names


def policy_config(base: SimConfig, policy: str, auto: AutoscaleConfig) -> SimConfig:
    """``base`` run under ``policy``: ``static`` without autoscaling, the others with
    ``auto`` and the planner's ``policy`` set."""
    if policy == "static":
        return replace(base, autoscale=None)
    settings = {**dict(auto.planner), "policy": policy}
    return replace(base, autoscale=replace(auto, planner=tuple(sorted(settings.items()))))


def slo_windows(
    results: Sequence[RequestResult],
    *,
    window_s: float,
    span_s: float,
    ttft_ms: float,
    tpot_ms: float,
    pct: float,
) -> dict[str, Any]:
    """The SLO windows by arrival (see the module docstring)."""
    ttft: dict[int, list[float]] = defaultdict(list)
    tpot: dict[int, list[float]] = defaultdict(list)
    for r in results:
        w = int(r.sent_s // window_s)
        ttft[w].append(r.ttft_s * 1e3 if r.ok and r.ttft_s is not None else FAILED_MS)
        if r.ok and r.tpot_s is not None:
            tpot[w].append(r.tpot_s * 1e3)
        elif not r.ok:
            tpot[w].append(FAILED_MS)
    n = max(1, math.ceil(span_s / window_s), *(w + 1 for w in ttft))
    q = pct / 100.0

    def missed(xs: list[float], target: float) -> bool:
        return bool(xs) and percentile(sorted(xs), q) > target

    ttft_miss = [missed(ttft[w], ttft_ms) for w in range(n)]
    tpot_miss = [missed(tpot[w], tpot_ms) for w in range(n)]
    missed_at = [w for w in range(n) if ttft_miss[w] or tpot_miss[w]]
    return {
        "windows": n,
        "met": n - len(missed_at),
        "share": round((n - len(missed_at)) / n, 4),
        "ttft_missed": sum(ttft_miss),
        "tpot_missed": sum(tpot_miss),
        "missed": missed_at,
    }


def replica_seconds(rows: Sequence[Mapping[str, Any]], interval_s: float) -> float:
    """Replica-seconds of a run's timeline: each row's replicas (at its end) times its
    length (the last row: up to ``interval_s``)."""
    if not rows:
        return 0.0
    ends = [float(r["t_s"]) for r in rows[1:]] + [float(rows[-1]["t_s"]) + interval_s]
    total = 0.0
    for r, end in zip(rows, ends, strict=True):
        n = sum(int(r.get(f"replicas_{k}") or 0) for k in ("worker", "prefill", "decode"))
        total += n * (end - float(r["t_s"]))
    return total


def policy_row(
    policy: str, doc: Mapping[str, Any], windows: Mapping[str, Any], replica_s: float, start: int
) -> dict[str, Any]:
    """One policy's row: its SLO windows, cost and the bench's figures."""
    auto = (doc.get("sim") or {}).get("autoscale") or {}
    return {
        "policy": policy,
        "slo_windows_met": windows["met"],
        "slo_windows": windows["windows"],
        "slo_windows_share": windows["share"],
        "ttft_windows_missed": windows["ttft_missed"],
        "tpot_windows_missed": windows["tpot_missed"],
        "replica_s": round(replica_s, 1),
        "peak_replicas": int(auto.get("peak_replicas") or start),
        "scaling_decisions": int(auto.get("scaling_decisions") or 0),
        "ttft_p90_ms": (doc.get("ttft_ms") or {}).get("p90"),
        "tpot_p90_ms": (doc.get("tpot_ms") or {}).get("p90"),
        "slo_attainment": doc.get("slo_attainment"),
        "goodput_rps": doc.get("goodput_rps"),
        "failed": int(doc.get("failed") or 0),
    }


def with_ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with ``replica_s_vs_static`` (None without a static row)."""
    static = next((r for r in rows if r["policy"] == "static"), None)
    base = static["replica_s"] if static else 0.0
    return [{**r, "replica_s_vs_static": round(r["replica_s"] / base, 3) if base else None}
            for r in rows]  # fmt: skip


def _cell(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def policy_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a text table."""
    lines = [
        f"{'policy':<9} {'SLO windows':>12} {'replica-s':>10} {'vs static':>9} {'peak':>5} "
        f"{'TTFT p90':>9} {'TPOT p90':>9} {'attain':>7} {'failed':>6}"
    ]
    for r in rows:
        met = f"{r['slo_windows_met']}/{r['slo_windows']}"
        lines.append(
            f"{r['policy']:<9} {met:>12} {r['replica_s']:>10.0f} "
            f"{_cell(r['replica_s_vs_static'], '9.3f')} {r['peak_replicas']:>5} "
            f"{_cell(r['ttft_p90_ms'], '9.0f')} {_cell(r['tpot_p90_ms'], '9.1f')} "
            f"{_cell(r['slo_attainment'], '7.3f')} {r['failed']:>6}"
        )
    return "\n".join(lines)
