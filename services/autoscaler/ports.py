"""The seam between the planner and the reconciler (which drives drivers and membership).

The planner loop and the RPCs see the reconciler only through :class:`Reconciler`; the
reconciler (local processes, Kubernetes, dry-run drivers) implements it.
:class:`InMemoryReconciler` is a fake for tests and the virtual-time benchmark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from services.autoscaler.spec import DeploymentSpec

__all__ = [
    "InMemoryReconciler",
    "InstanceState",
    "InstanceView",
    "ReconcileError",
    "Reconciler",
    "UnwiredReconciler",
]

InstanceState = Literal["starting", "ready", "draining", "stopped", "failed"]


@dataclass(frozen=True)
class InstanceView:
    """One engine instance as the reconciler knows it, with the load the planner weighs
    (victim cost, queue backlog). ``role`` is the role's name in the spec."""

    instance_id: str
    deployment: str
    role: str
    state: InstanceState
    url: str = ""
    epoch: int = 0
    in_flight: int = 0
    queued: int = 0
    cached_blocks: int = 0
    updated_ms: int = 0
    detail: str = ""  # e.g. the last driver error of a failed instance


class ReconcileError(RuntimeError):
    """The reconciler refused or could not accept a target (one-line reason)."""


class Reconciler(Protocol):
    """Drives actual instances toward the planner's targets.

    Contract:

    * ``apply(spec, targets, victims)``: make each role of ``spec`` have ``targets[role]``
      ready-or-starting instances (roles not in ``targets`` keep their count). When a role
      shrinks, remove exactly the ``victims`` listed for it (the planner's cheapest first),
      draining each (no new requests, in-flight ones finish, bounded by the spec's
      ``coordination.drain_timeout_s``) before stopping it. Returns once the change is
      accepted, not when it is done; progress is visible through ``instances``. Idempotent
      for the same arguments. Raises :class:`ReconcileError` with a one-line reason when
      it cannot accept the change (the planner records the decision as "failed").
      Every role at 0 with every instance a victim removes the deployment's instances.
    * ``instances(deployment)``: the instances of ``deployment`` ("" = all) in every state,
      with their current load. Cheap and non-blocking (a snapshot the reconciler keeps).
    """

    async def apply(
        self, spec: DeploymentSpec, targets: Mapping[str, int], victims: Sequence[str]
    ) -> None: ...

    def instances(self, deployment: str = "") -> Sequence[InstanceView]: ...


@dataclass
class InMemoryReconciler:
    """A fake reconciler: instances appear at once (``start_state``), victims are removed
    at once. Records every call in ``calls``; ``fail_with`` makes ``apply`` refuse."""

    start_state: InstanceState = "ready"
    fail_with: str = ""
    calls: list[tuple[str, dict[str, int], tuple[str, ...]]] = field(default_factory=list)
    _instances: dict[str, InstanceView] = field(default_factory=dict)
    _next: int = 0

    async def apply(
        self, spec: DeploymentSpec, targets: Mapping[str, int], victims: Sequence[str]
    ) -> None:
        self.calls.append((spec.name, dict(targets), tuple(victims)))
        if self.fail_with:
            raise ReconcileError(self.fail_with)
        for vid in victims:
            self._instances.pop(vid, None)
        for role, want in targets.items():
            have = [
                i
                for i in self._instances.values()
                if i.deployment == spec.name and i.role == role and i.state in ("starting", "ready")
            ]
            for _ in range(want - len(have)):
                self._next += 1
                iid = f"{spec.name}-{role}-{self._next}"
                self._instances[iid] = InstanceView(iid, spec.name, role, self.start_state)

    def instances(self, deployment: str = "") -> Sequence[InstanceView]:
        return [i for i in self._instances.values() if not deployment or i.deployment == deployment]

    def put(self, instance: InstanceView) -> None:
        """Add or replace an instance (tests: set load or state)."""
        self._instances[instance.instance_id] = instance

    def set_state(self, instance_id: str, state: InstanceState) -> None:
        self._instances[instance_id] = replace(self._instances[instance_id], state=state)


class UnwiredReconciler:
    """The reconciler until a driver is wired in: no instances, and every change refused
    (decisions are stored as "failed: no reconciler wired"). Run with ``advisory`` to
    record the planner's advice without this error."""

    async def apply(
        self, spec: DeploymentSpec, targets: Mapping[str, int], victims: Sequence[str]
    ) -> None:
        del targets, victims
        raise ReconcileError(f"no reconciler wired: cannot scale {spec.name!r}")

    def instances(self, deployment: str = "") -> Sequence[InstanceView]:
        del deployment
        return []
