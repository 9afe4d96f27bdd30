"""What the reconciler asks a driver for next (pure: a function of the target and the
instances that exist).

Rules, per deployment:

- A role's *current* count is its STARTING, READY and FAILED (being restarted) instances, as
  :func:`~services.common.planner.driver_base.counted`; its *progress* is ready / target.
- **Dependencies, scale-out**: a role whose dependencies are not serving yet (a dependency
  with a non-zero target has no READY instance) waits; its step is left out with a reason.
- **Dependencies, scale-in**: a role scales in only after every role that depends on it has
  reached its own (lower) target, so a dependency never disappears under its dependents.
- **maxSkew, scale-out**: among roles still short of ready replicas, a role may be brought to
  at most ``ceil(target * min(1, slowest progress + max_skew))`` replicas, where the slowest
  progress is the least ready/target of those roles (RoleBasedGroup CoordinatedPolicy
  scaling ``maxSkew`` as a fraction). ``max_skew`` 1.0 = uncoordinated. A role never asks
  for fewer than it has on the way (pending instances are capacity, not a reason to cascade).
- Roles at their target get no step. Scale-in steps carry the caller's victims for the role.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.common.planner.driver_base import (
    DeploymentTarget,
    InstanceState,
    InstanceStatus,
)

__all__ = ["RoleCount", "Step", "StepPlan", "count_of", "count_roles", "plan_steps"]


@dataclass(frozen=True)
class RoleCount:
    """Instances of one role by state. ``current`` = starting + ready + failed."""

    starting: int = 0
    ready: int = 0
    draining: int = 0
    failed: int = 0

    @property
    def current(self) -> int:
        return self.starting + self.ready + self.failed


@dataclass(frozen=True)
class Step:
    """Ask the driver to bring ``role`` to ``replicas``, removing ``victims`` first."""

    role: str
    replicas: int
    victims: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepPlan:
    """Steps to take now, and roles that wait (role -> why)."""

    steps: tuple[Step, ...]
    waiting: Mapping[str, str]

    @property
    def converged(self) -> bool:
        return not self.steps and not self.waiting


def count_of(instances: Sequence[InstanceStatus], role_name: str) -> RoleCount:
    """The instances of ``role_name`` by state."""
    mine = [i for i in instances if i.role_name == role_name]
    return RoleCount(
        starting=sum(i.state == InstanceState.STARTING for i in mine),
        ready=sum(i.state == InstanceState.READY for i in mine),
        draining=sum(i.state == InstanceState.DRAINING for i in mine),
        failed=sum(i.state == InstanceState.FAILED for i in mine),
    )


def count_roles(
    target: DeploymentTarget, instances: Sequence[InstanceStatus]
) -> dict[str, RoleCount]:
    """Per role of ``target``, its instances by state."""
    return {r.name: count_of(instances, r.name) for r in target.roles}


def _skew_cap(target: int, slowest: float, max_skew: float) -> int:
    return min(target, math.ceil(target * min(1.0, slowest + max_skew) - 1e-9))


def plan_steps(
    target: DeploymentTarget,
    instances: Sequence[InstanceStatus],
    victims: Mapping[str, Sequence[str]] | None = None,
) -> StepPlan:
    """The steps to take now for ``target`` given ``instances``; see the module rules."""
    counts = count_roles(target, instances)
    want = {r.name: r.replicas for r in target.roles}
    short = [n for n in want if counts[n].ready < want[n]]
    slowest = min((counts[n].ready / want[n] for n in short), default=1.0)
    dependents: dict[str, list[str]] = {n: [] for n in want}
    for r in target.roles:
        for d in r.dependencies:
            dependents.setdefault(d, []).append(r.name)
    steps: list[Step] = []
    waiting: dict[str, str] = {}
    for r in target.roles:
        have = counts[r.name].current
        if want[r.name] > have:
            blocked = [d for d in r.dependencies if want.get(d, 0) > 0 and counts[d].ready == 0]
            if blocked:
                waiting[r.name] = f"waits for {', '.join(blocked)} to serve"
                continue
            ask = max(have, _skew_cap(want[r.name], slowest, target.max_skew))
            if ask > have:
                steps.append(Step(r.name, ask))
            elif counts[r.name].ready == have:  # nothing of its own on the way: held back
                waiting[r.name] = (
                    f"held by maxSkew {target.max_skew:g} (slowest role at {slowest:.0%})"
                )
        elif want[r.name] < have:
            busy = [d for d in dependents.get(r.name, []) if counts[d].current > want[d]]
            if busy:
                waiting[r.name] = f"scales in after {', '.join(busy)}"
                continue
            steps.append(Step(r.name, want[r.name], tuple((victims or {}).get(r.name, ()))))
    return StepPlan(tuple(steps), waiting)
