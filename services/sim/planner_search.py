"""``tideserve recommend``'s last step: the planner settings for the recommended fleet.

The fleet search (:mod:`services.sim.search`) sizes a fixed fleet for the whole trace; a
deployment runs with the autoscaler's planner, which may run fewer replicas where the load
allows. This step runs the recommended fleet autoscaled (it starts at the recommended size,
each role between 1 and twice its size, as the written spec allows; with P/D the
simulator's one bound for every role is twice the larger role) under the planner
settings a deployment spec can set (its ``planner`` section,
:class:`~services.common.planner.spec.PlannerSpec`): first the autoscaler's own settings, then
each other value of one setting at a time over the best so far (coordinate descent), a
value kept when it meets the SLOs with fewer replica-seconds (or meets them where the best
so far does not). Cost: one run, plus one per value tried.

:func:`tune` is pure (a run is a callback); :func:`runner` is the shell that simulates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from services.common.bench.traces import Trace
from services.common.planner.spec import PlannerSpec
from services.sim import simulate
from services.sim.autoscale import AutoscaleConfig
from services.sim.config import SimConfig, SimConfigError
from services.sim.policies import replica_seconds
from services.sim.search import Candidate, Outcome, Slo, judge

__all__ = ["AXES", "PlannerOutcome", "parse_axes", "planner_rows", "runner", "tune"]

AXES: dict[str, type] = {
    "policy": str,
    "predictor": str,
    "max_utilization": float,
    "decode_headroom": float,
}
"""The planner settings a spec's ``planner`` section holds, with their value types."""

PlannerSettings = tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class PlannerOutcome:
    """The recommended fleet autoscaled under ``settings`` (the changes from the
    autoscaler's): the verdict against the SLOs, replica-seconds and peak replicas."""

    settings: PlannerSettings
    outcome: Outcome
    replica_s: float
    peak: int


def parse_axes(texts: Mapping[str, str]) -> list[tuple[str, list[Any]]]:
    """``{setting: "a,b"}`` as the values to try, each checked as a spec would check it;
    raises ``SimConfigError`` naming the setting. Empty lists are left out."""
    out: list[tuple[str, list[Any]]] = []
    for name, text in texts.items():
        kind = AXES[name]
        values: list[Any] = []
        for item in (x.strip() for x in text.split(",") if x.strip()):
            try:
                value = kind(item)
                PlannerSpec.model_validate({name: value})
            except (ValueError, ValidationError):
                flag = f"--try-{name.replace('_', '-')}"
                raise SimConfigError(f"{flag}: {item!r} is not a planner {name}") from None
            values.append(value)
        if values:
            out.append((name, values))
    return out


def _with(settings: PlannerSettings, name: str, value: Any) -> PlannerSettings:
    return tuple(sorted({**dict(settings), name: value}.items()))


def _better(o: PlannerOutcome, than: PlannerOutcome) -> bool:
    if not o.outcome.passes:
        return False
    return not than.outcome.passes or o.replica_s < than.replica_s


def tune(
    axes: Sequence[tuple[str, Sequence[Any]]],
    run: Callable[[PlannerSettings], PlannerOutcome],
) -> tuple[PlannerOutcome, list[PlannerOutcome]]:
    """The best planner settings (see the module docstring) and every outcome seen."""
    best = run(())
    seen = [best]
    for name, values in axes:
        now = dict(best.settings).get(name)
        tried = [run(_with(best.settings, name, v)) for v in dict.fromkeys(values) if v != now]
        seen += tried
        better = [o for o in tried if _better(o, best)]
        if better:
            best = min(better, key=lambda o: (o.replica_s, len(o.settings)))
    return best, seen


def planner_rows(
    best: PlannerOutcome, seen: Sequence[PlannerOutcome], fixed_replica_s: float, percentile: int
) -> list[dict[str, Any]]:
    """One row per planner run, cheapest passing first, with why each is not the choice."""

    def why(o: PlannerOutcome) -> str:
        if o is best:
            return "" if o.outcome.passes else f"misses: {o.outcome.why} (no setting met the SLOs)"
        if not o.outcome.passes:
            return f"misses: {o.outcome.why}"
        if o.replica_s > best.replica_s:
            return f"passes, but {o.replica_s:.0f} replica-s > {best.replica_s:.0f}"
        return "passes, but saves nothing over the chosen settings"

    order = sorted(seen, key=lambda o: (not o.outcome.passes, o.replica_s, len(o.settings)))
    return [
        {
            "planner": dict(o.settings) or "the autoscaler's",
            "replica_s": round(o.replica_s, 1),
            "replica_s_vs_fixed": round(o.replica_s / fixed_replica_s, 3)
            if fixed_replica_s
            else None,
            "peak_replicas": o.peak,
            f"ttft_p{percentile}_ms": round(o.outcome.ttft_ms, 1),
            f"tpot_p{percentile}_ms": round(o.outcome.tpot_ms, 2),
            "slo_attainment": round(o.outcome.attainment, 4),
            "passes": o.outcome.passes,
            "why_not": why(o),
        }
        for o in order
    ]


def runner(
    cfg: SimConfig, candidate: Candidate, trace: Trace, slo: Slo, startup_s: float
) -> Callable[[PlannerSettings], PlannerOutcome]:
    """A run of ``cfg`` (the recommended fleet) autoscaled under given settings."""
    top = 2 * max(cfg.engines if not cfg.pd else max(cfg.prefill, cfg.decode), 1)
    auto = AutoscaleConfig(
        min_replicas=1, max_replicas=top, startup_s=startup_s, ttft_ms=slo.ttft_ms,
        tpot_ms=slo.tpot_ms, percentile=float(slo.percentile),
    )  # fmt: skip

    def run(settings: PlannerSettings) -> PlannerOutcome:
        one = replace(cfg, autoscale=replace(auto, planner=settings)).validate()
        doc, sim_run = simulate(one, trace)
        peak = ((doc.get("sim") or {}).get("autoscale") or {}).get("peak_replicas", 0)
        rs = replica_seconds(sim_run.timeline.rows, one.timeline_s)
        return PlannerOutcome(settings, judge(candidate, doc, slo), rs, int(peak or 0))

    return run
