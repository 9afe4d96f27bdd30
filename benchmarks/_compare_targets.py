"""What routing_compare's results mean: issue 5's ratios of our router to each baseline,
issue 10's closed-loop ratio, and the gateway's own TTFT prediction error. Pure (dicts and
records in, dicts out), so the smoke tests check them without running anything."""

from __future__ import annotations

from typing import Any

__all__ = ["closed_loop_targets", "prediction_error", "targets"]


def prediction_error(records: list[Any]) -> dict[str, Any]:
    """Median |predicted - actual| / actual TTFT of the gateway's own predictions (the
    records' ``predicted_ttft_ms``), over the run and over its second half by arrival."""
    ok = sorted((r for r in records if r.ttft_ms > 0 and r.predicted_ttft_ms > 0),
                key=lambda r: r.arrival_ms)  # fmt: skip

    def med(rs: list[Any]) -> float | None:
        if not rs:
            return None
        errs = sorted(abs(r.predicted_ttft_ms - r.ttft_ms) / r.ttft_ms for r in rs)
        return round(errs[len(errs) // 2], 4)

    return {"records": len(ok), "all": med(ok), "second_half": med(ok[len(ok) // 2 :])}


def closed_loop_targets(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 10: with the fit, mean TTFT within 10% of the run believing the true profile."""
    ok = {r["router"]: r for r in results if "error" not in r}
    true, wrong, fit = (ok.get(k) for k in ("true-profile", "wrong-profile", "wrong-profile+fit"))
    out: dict[str, Any] = {
        "ttft_mean_ms": {k: _get(r, "ttft_ms", "mean") for k, r in ok.items()},
        "wrong_vs_true": _ratio(_get(wrong, "ttft_ms", "mean"), _get(true, "ttft_ms", "mean")),
        "fit_vs_true": _ratio(_get(fit, "ttft_ms", "mean"), _get(true, "ttft_ms", "mean")),
        "target": "fit_vs_true <= 1.10",
    }
    f = out["fit_vs_true"]
    out["met"] = f is not None and f <= 1.10
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def _get(r: dict[str, Any] | None, *path: str) -> float | None:
    cur: Any = r
    for k in path:
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return float(cur) if isinstance(cur, int | float) else None


def targets(results: list[dict[str, Any]], ours: str = "tideserve:default") -> dict[str, Any]:
    """Issue 5's ratios for ``ours`` against each baseline that produced a result."""
    ok = {r["router"]: r for r in results if "error" not in r}
    me = ok.get(ours)
    out: dict[str, Any] = {"ours": ours}
    if me is None:
        out["missing"] = f"{ours} has no result"
        return out
    for base, limit in (("sglang:cache_aware", 0.8), ("sglang:round_robin", 0.5),
                        ("tideserve:round_robin", 0.5)):  # fmt: skip
        b = ok.get(base)
        if b is None:
            continue
        mean = _ratio(_get(me, "ttft_ms", "mean"), _get(b, "ttft_ms", "mean"))
        p90 = _ratio(_get(me, "ttft_ms", "p90"), _get(b, "ttft_ms", "p90"))
        out[f"vs_{base}"] = {
            "ttft_mean_ratio": mean,
            "ttft_p90_ratio": p90,
            "ttft_target": f"<= {limit}",
            "ttft_met": mean is not None and p90 is not None and mean <= limit and p90 <= limit,
            "goodput_ratio": _ratio(_get(me, "goodput_rps"), _get(b, "goodput_rps")),
        }
        if "round_robin" in base:
            g = out[f"vs_{base}"]["goodput_ratio"]
            out[f"vs_{base}"]["goodput_target"] = ">= 2.0"
            out[f"vs_{base}"]["goodput_met"] = g is not None and g >= 2.0
    hit, inf = _get(me, "cache_hit_ratio"), _get(me, "infinite_cache_hit_ratio")
    frac = _ratio(hit, inf)
    out["cache_hit_vs_infinite"] = {
        "cache_hit_ratio": hit, "infinite_cache_hit_ratio": inf, "fraction": frac,
        "target": ">= 0.9 (within 10%)", "met": frac is not None and frac >= 0.9,
    }  # fmt: skip
    out["any_run_cpu_saturated"] = any(bool(_get(r, "cpu", "saturated")) for r in ok.values())
    return out
