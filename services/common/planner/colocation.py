"""Tidal co-location (潮汐混部): deployments sharing one replica budget (pure).

Rule: every deployment first gets its floor (the sum of its roles' min_replicas); what is
left goes to the deployments' wants in priority order (highest first, then name). So a
deployment whose tide ebbs lends the replicas it no longer wants to the others, and when a
higher-priority deployment's tide rises the replicas come back from the lowest priority
first (its victims are drained before removal). Within a deployment, :func:`fit_roles`
removes replicas from the role furthest above its minimum, keeping the P:D ratio bounds
when it can.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.common.planner.spec import DeploymentSpec

__all__ = ["Claim", "allocate", "fit_roles", "ratio_ok"]


@dataclass(frozen=True)
class Claim:
    name: str
    priority: int
    floor: int
    want: int


def allocate(budget: int, claims: Sequence[Claim]) -> dict[str, int]:
    """Replicas each claim gets out of ``budget`` (floors always; see the module rule)."""
    out = {c.name: c.floor for c in claims}
    left = budget - sum(out.values())
    for c in sorted(claims, key=lambda c: (-c.priority, c.name)):
        extra = max(0, min(c.want - c.floor, left))
        out[c.name] += extra
        left -= extra
    return out


def ratio_ok(spec: DeploymentSpec, targets: Mapping[str, int]) -> bool:
    """Whether ``targets`` keep the P:D ratio bounds (true without bounds)."""
    lo, hi = spec.coordination.min_pd_ratio, spec.coordination.max_pd_ratio
    if not (lo or hi):
        return True
    p = sum(targets[r.name] for r in spec.roles_of("prefill"))
    d = sum(targets[r.name] for r in spec.roles_of("decode"))
    if d == 0:
        return p == 0
    ratio = p / d
    return (not lo or ratio >= lo - 1e-9) and (not hi or ratio <= hi + 1e-9)


def fit_roles(spec: DeploymentSpec, targets: Mapping[str, int], limit: int) -> dict[str, int]:
    """``targets`` reduced to at most ``limit`` replicas in total (never below min)."""
    out = dict(targets)
    mins = {r.name: r.min_replicas for r in spec.roles}
    while sum(out.values()) > limit:
        movable = sorted(
            (n for n in out if out[n] > mins[n]), key=lambda n: (-(out[n] - mins[n]), n)
        )
        if not movable:
            break
        keeping = [n for n in movable if ratio_ok(spec, {**out, n: out[n] - 1})]
        pick = (keeping or movable)[0]
        out[pick] -= 1
    return out
