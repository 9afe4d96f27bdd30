"""The seam between the planner and the reconciler (which drives drivers and membership).

The planner loop and the RPCs see the reconciler only through :class:`Reconciler`; the
reconciler (local processes, Kubernetes, dry-run drivers) implements it.
:class:`InMemoryReconciler` is a fake for tests and the virtual-time benchmark.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from services.common.planner.driver_base import InstanceState, InstanceStatus, Role
from services.common.planner.spec import DeploymentSpec

__all__ = [
    "InMemoryReconciler",
    "InstanceState",
    "InstanceView",
    "ReconcileError",
    "Reconciler",
]


@dataclass(frozen=True)
class InstanceView:
    """One instance as the planner weighs it: the driver's :class:`InstanceStatus` (the one
    instance type: id, deployment, role name and kind, state, endpoint, restarts, last
    error) plus the load the planner needs for backlog and victim cost, which the driver
    does not know (the seam fills it from the engine's ``/metrics``), and
    ``session_blocks``: the KV blocks of the live agent sessions homed there, which a
    scale-in would have to move (kvmeta's figure; 0 when kvmeta is not configured), and
    ``active_session_tokens``: the prefix tokens of those sessions that are *active* (a turn
    in flight, one ended within kvmeta's active window, or a predicted return ahead), which
    the planner's scale-in floor keeps room for (:mod:`.sessionkv`). The
    properties keep the planner's vocabulary: ``role`` is the role's *name* in the spec."""

    status: InstanceStatus
    in_flight: int = 0
    queued: int = 0
    cached_blocks: int = 0
    session_blocks: int = 0
    active_session_tokens: int = 0

    @classmethod
    def of(
        cls,
        instance_id: str,
        deployment: str,
        role: str,
        state: InstanceState | str,
        *,
        url: str = "",
        in_flight: int = 0,
        queued: int = 0,
        cached_blocks: int = 0,
        session_blocks: int = 0,
        active_session_tokens: int = 0,
        detail: str = "",
    ) -> InstanceView:
        """A view built by hand (fakes, tests, the virtual-time benchmark): the role kind
        is unknown (``worker``); ListInstances takes the kind from the spec."""
        status = InstanceStatus(
            instance_id, deployment, role, Role.WORKER, InstanceState(state), endpoint=url,
            last_error=detail,
        )  # fmt: skip
        return cls(status, in_flight, queued, cached_blocks, session_blocks, active_session_tokens)

    @property
    def instance_id(self) -> str:
        return self.status.instance_id

    @property
    def deployment(self) -> str:
        return self.status.deployment

    @property
    def role(self) -> str:
        return self.status.role_name

    @property
    def state(self) -> InstanceState:
        return self.status.state

    @property
    def url(self) -> str:
        return self.status.endpoint

    @property
    def detail(self) -> str:
        return self.status.last_error


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
      ``reason`` (the decision's reasons, one line) is carried into membership events.
      Every role at 0 with every instance a victim removes the deployment's instances.
    * ``instances(deployment)``: the instances of ``deployment`` ("" = all) in every state,
      with their current load. Cheap and non-blocking (a snapshot the reconciler keeps).
    * ``progress(deployment)``: one line for ``describe``: "converged", "applying: ...",
      "half-applied: <error>"; "" for a deployment it was never given.
    """

    async def apply(
        self,
        spec: DeploymentSpec,
        targets: Mapping[str, int],
        victims: Sequence[str],
        reason: str = "",
    ) -> None: ...

    def instances(self, deployment: str = "") -> Sequence[InstanceView]: ...

    def progress(self, deployment: str) -> str: ...


@dataclass
class InMemoryReconciler:
    """A fake reconciler: instances appear at once (``start_state``), victims are removed
    at once. Records every call in ``calls``; ``fail_with`` makes ``apply`` refuse."""

    start_state: InstanceState = InstanceState.READY
    fail_with: str = ""
    calls: list[tuple[str, dict[str, int], tuple[str, ...]]] = field(default_factory=list)
    _instances: dict[str, InstanceView] = field(default_factory=dict)
    _next: int = 0

    async def apply(
        self,
        spec: DeploymentSpec,
        targets: Mapping[str, int],
        victims: Sequence[str],
        reason: str = "",
    ) -> None:
        del reason
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
                self._instances[iid] = InstanceView.of(iid, spec.name, role, self.start_state)

    def instances(self, deployment: str = "") -> Sequence[InstanceView]:
        return [i for i in self._instances.values() if not deployment or i.deployment == deployment]

    def progress(self, deployment: str) -> str:
        return "converged" if any(c[0] == deployment for c in self.calls) else ""

    def put(self, instance: InstanceView) -> None:
        """Add or replace an instance (tests: set load or state)."""
        self._instances[instance.instance_id] = instance

    def set_state(self, instance_id: str, state: InstanceState | str) -> None:
        view = self._instances[instance_id]
        status = replace(view.status, state=InstanceState(state))
        self._instances[instance_id] = replace(view, status=status)
