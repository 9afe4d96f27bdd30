"""Co-location step over deployments sharing a budget group (pure).

Each deployment is planned alone (:func:`.core.on_tick`); then :func:`.colocation.allocate`
splits the group's budget by floor and priority, and a deployment allotted less than it
wants is cut to its allotment (:func:`.core.finish` with ``limit``), its cheapest instances
listed as victims to drain first. Deployments whose decisions fit are returned unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.common.planner.colocation import Claim, allocate
from services.common.planner.config import PlannerConfig
from services.common.planner.core import Decision, finish
from services.common.planner.inputs import PlannerInputs

__all__ = ["plan_group"]


def plan_group(
    now: float,
    group: str,
    budget: int,
    inputs: Mapping[str, PlannerInputs],
    decisions: Mapping[str, Decision],
    cfg: PlannerConfig,
) -> dict[str, Decision]:
    """``decisions`` (one per deployment of ``group``) fitted into ``budget`` replicas."""
    claims = [
        Claim(
            name,
            inputs[name].spec.budget.priority,
            sum(r.min_replicas for r in inputs[name].spec.roles),
            d.total,
        )
        for name, d in decisions.items()
    ]
    allotted = allocate(budget, claims)
    out: dict[str, Decision] = {}
    for c in claims:
        d = decisions[c.name]
        if allotted[c.name] >= d.total:
            out[c.name] = d
            continue
        higher = sorted(o.name for o in claims if o.priority > c.priority)
        why = (
            f"budget group {group} ({budget} replicas): priority {c.priority} allotted "
            f"{allotted[c.name]} of {d.total}"
            + (f"; reclaimed for higher priority {', '.join(higher)}" if higher else "")
        )
        out[c.name] = finish(
            now,
            inputs[c.name],
            d.targets,
            [*d.reasons, why],
            d.binding,
            cfg,
            d.state,
            d.forecast.get("horizons", {}),
            limit=allotted[c.name],
        )
    return out
