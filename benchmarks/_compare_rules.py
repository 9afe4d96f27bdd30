"""The rules routing_compare runs a comparison under, and its per-router aggregation over
runs (pure: arguments and result dicts in, dicts and strings out).

Two rule sets, mechanically identical for every router:

* the figures of record (default): the SLO reaches Tideserve's gateway only the way a user
  configures it, as the targets of the gateway's default SLO class in a ``--slo-config``
  file, written from the same ``--slo-ttft-ms``/``--slo-tpot-ms`` the bench scores with;
  the engines run ``--profile`` ``--engine-slowdown`` times slower (``NAME*FACTOR``), and the
  gateway keeps its shipped default perf profile (it is not told what the engines run);
* ``--old-rules``: the earlier, favourable setup: the gateway files every request under the
  ``interactive`` class (whose 2 s TTFT target happens to equal the bench's default SLO) and
  the engines run ``--profile`` itself, which the gateway's default profile then equals.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from typing import Any

from services.common.perfmodel import DEFAULT_PROFILE
from services.scheduler.settings import SchedulerSettings
from services.scheduler.slo import DEFAULT_SLO_CLASSES

__all__ = [
    "METRICS",
    "OLD_RULES_SLO_CLASS",
    "engine_profile",
    "gateway_perf_profile",
    "mean_results",
    "per_router",
    "slo_config",
]

OLD_RULES_SLO_CLASS = "interactive"

# (path in a result, name in the summary)
METRICS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("ttft_ms", "mean"), "ttft_mean_ms"),
    (("ttft_ms", "p90"), "ttft_p90_ms"),
    (("tpot_ms", "mean"), "tpot_mean_ms"),
    (("goodput_rps",), "goodput_rps"),
    (("slo_attainment",), "slo_attainment"),
    (("cache_hit_ratio",), "cache_hit_ratio"),
    (("completed",), "completed"),
    (("failed",), "failed"),
)


def slo_config(ttft_ms: float, tpot_ms: float) -> dict[str, Any]:
    """A tideserve.yaml ``scheduler`` section with the shipped SLO classes and default class,
    the default class's TTFT and TPOT targets set to the bench's SLO (what a user whose
    traffic has that SLO would write)."""
    default = str(SchedulerSettings.model_fields["default_slo_class"].default)
    classes = []
    for c in DEFAULT_SLO_CLASSES:
        d = c.model_dump()
        if c.name == default:
            d.update(ttft_ms=ttft_ms, tpot_ms=tpot_ms)
        classes.append(d)
    return {"scheduler": {"slo_classes": classes, "default_slo_class": default}}


def engine_profile(args: argparse.Namespace) -> str:
    """The perf profile the engines run: ``--profile``, slowed unless ``--old-rules``."""
    factor = 1.0 if args.old_rules else args.engine_slowdown
    return args.profile if factor == 1.0 else f"{args.profile}*{factor:g}"


def gateway_perf_profile(args: argparse.Namespace, variant: dict[str, Any] | None) -> str:
    """The perf profile a Tideserve gateway of this run prices with (what it is given, else
    its shipped default), and whether telemetry's fitted model may replace it."""
    v = variant or {}
    name = v.get("perf_profile") or args.gateway_perf_profile or DEFAULT_PROFILE
    return f"{name} (+ telemetry's fitted model once confident)" if v.get("fit") else str(name)


def _get(r: dict[str, Any], path: Sequence[str]) -> float | None:
    cur: Any = r
    for k in path:
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return float(cur) if isinstance(cur, int | float) and not isinstance(cur, bool) else None


def per_router(results: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per router (in first-run order): the runs that produced a result and, per metric,
    the mean and the range (min, max) over them."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        entry = out.setdefault(r["router"], {"runs": 0, "errors": 0, "metrics": {}})
        if "error" in r:
            entry["errors"] += 1
            continue
        entry["runs"] += 1
        for path, name in METRICS:
            v = _get(r, path)
            if v is not None:
                entry["metrics"].setdefault(name, []).append(v)
    for entry in out.values():
        entry["metrics"] = {
            name: {
                "mean": round(statistics.fmean(vs), 4),
                "min": round(min(vs), 4),
                "max": round(max(vs), 4),
            }
            for name, vs in entry["metrics"].items()
        }
    return out


def mean_results(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per router with the means over its runs, in the shape ``targets`` reads
    (``cpu.saturated``: whether any of its runs was CPU-saturated)."""
    out = []
    for router, entry in per_router(results).items():
        if not entry["runs"]:
            out.append({"router": router, "error": "no run produced a result"})
            continue
        runs = [r for r in results if r["router"] == router and "error" not in r]
        m = {name: v["mean"] for name, v in entry["metrics"].items()}
        inf = [v for r in runs if (v := _get(r, ("infinite_cache_hit_ratio",))) is not None]
        out.append({
            "router": router,
            "ttft_ms": {"mean": m.get("ttft_mean_ms"), "p90": m.get("ttft_p90_ms")},
            "tpot_ms": {"mean": m.get("tpot_mean_ms")},
            "goodput_rps": m.get("goodput_rps"),
            "cache_hit_ratio": m.get("cache_hit_ratio"),
            "infinite_cache_hit_ratio": statistics.fmean(inf) if inf else None,
            "cpu": {"saturated": any(bool((r.get("cpu") or {}).get("saturated")) for r in runs)},
        })  # fmt: skip
    return out
