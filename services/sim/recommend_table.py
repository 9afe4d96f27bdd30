"""What ``tideserve recommend`` prints and writes per candidate (pure): the JSON row of a
run, the table of every run, and the table of the planner step's runs."""

from __future__ import annotations

from typing import Any

from services.sim.search import TIER, Outcome

__all__ = ["planner_table", "row", "table"]


def row(o: Outcome, why: str, percentile: int, base: dict[str, int]) -> dict[str, Any]:
    c = o.candidate
    settings = {**base, **dict(c.settings)}
    return {
        "candidate": c.label,
        "layout": c.family.layout,
        "profile": c.family.profile,
        "engines": c.engines,
        "prefill": c.prefill,
        "decode": c.decode,
        "instances": c.instances,
        **{name: value for name, value in settings.items()},
        "settings_changed": dict(c.settings),
        f"ttft_p{percentile}_ms": round(o.ttft_ms, 1),
        f"tpot_p{percentile}_ms": round(o.tpot_ms, 2),
        "slo_attainment": round(o.attainment, 4),
        "failed": o.failed,
        "passes": o.passes,
        "why_not": why,
        **o.extra,
    }


def table(rows: list[dict[str, Any]], percentile: int) -> str:
    tier = any(TIER in r for r in rows)  # the tier's column (MiB) with agent memory
    head = (
        f"{'fleet':<12} {'profile':<12} {'batch':>5} {'tokens':>6} {'kv':>6} "
        + (f"{'tier MiB':>8} " if tier else "")
        + f"{'TTFT p' + str(percentile):>11} {'TPOT':>8} {'attain':>7}  verdict"
    )
    lines = [head]
    for r in rows:
        verdict = "RECOMMENDED" if r["passes"] and not r["why_not"] else r["why_not"]
        fleet = f"{r['engines']} workers" if r["engines"] else f"{r['prefill']}P+{r['decode']}D"
        lines.append(
            f"{fleet:<12} {r['profile']:<12} {r['max_batch']:>5} {r['max_batched_tokens']:>6} "
            f"{r['kv_blocks']:>6} "
            + (f"{r.get(TIER, 0):>8} " if tier else "")
            + f"{r[f'ttft_p{percentile}_ms']:>9.0f}ms "
            f"{r[f'tpot_p{percentile}_ms']:>6.1f}ms {r['slo_attainment']:>7.3f}  {verdict}"
        )
    return "\n".join(lines)


def planner_table(rows: list[dict[str, Any]], percentile: int) -> str:
    lines = [
        "the recommended fleet autoscaled (from its size; a role 1 to twice the largest):",
        f"{'planner settings':<44} {'replica-s':>9} {'vs fixed':>8} {'peak':>4} "
        f"{'TTFT p' + str(percentile):>11} {'TPOT':>8}  verdict",
    ]
    for r in rows:
        what = (
            r["planner"]
            if isinstance(r["planner"], str)
            else ", ".join(f"{k}={v}" for k, v in r["planner"].items())
        )
        verdict = "BEST" if r["passes"] and not r["why_not"] else r["why_not"]
        ratio = "-" if r["replica_s_vs_fixed"] is None else f"{r['replica_s_vs_fixed']:.3f}"
        lines.append(
            f"{what:<44} {r['replica_s']:>9.0f} {ratio:>8} {r['peak_replicas']:>4} "
            f"{r[f'ttft_p{percentile}_ms']:>9.0f}ms {r[f'tpot_p{percentile}_ms']:>6.1f}ms  "
            f"{verdict}"
        )
    best = next((r for r in rows if r["passes"] and not r["why_not"]), None)
    if best is not None and (best["replica_s_vs_fixed"] or 0.0) > 1.0:
        lines.append(
            f"(autoscaled, the best settings cost {best['replica_s_vs_fixed']:.2f}x the fixed "
            "fleet's replica-seconds on this trace)"
        )
    return "\n".join(lines)
