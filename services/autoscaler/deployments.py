"""Deployment operations behind the RPCs (the shell the servicer translates to).

Apply, get (desired vs actual), list, delete (every instance drained through the
reconciler first), manual scale (a decision with reason "manual", checked against min/max
and the P:D ratio bounds by the pure :func:`manual_targets`; pinned on request: every planner
policy holds a pin until a changed apply or a release), plan, instances, decisions.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from services.autoscaler.loop import PlannerLoop
from services.autoscaler.reconcile_core import count_of
from services.autoscaler.reconciler import RoleStatus
from services.autoscaler.scope import EVERY, NotManaged, Scope
from services.autoscaler.store import AutoscalerStore
from services.common.planner import Decision
from services.common.planner.colocation import ratio_ok
from services.common.planner.ports import InstanceView, ReconcileError, Reconciler
from services.common.planner.records import DecisionRecord, RoleChange
from services.common.planner.spec import DeploymentSpec
from services.common.planner.victims import active, pick_victims

__all__ = [
    "DeploymentView",
    "Deployments",
    "NotManaged",
    "ScaleRefused",
    "UnknownDeployment",
    "manual_targets",
]


class UnknownDeployment(LookupError):
    """No such deployment (or role)."""


class ScaleRefused(ValueError):
    """A manual scale outside the role's bounds or the ratio bounds."""


@dataclass(frozen=True)
class DeploymentView:
    spec: DeploymentSpec
    roles: tuple[RoleStatus, ...]
    instances: tuple[InstanceView, ...]
    decisions: tuple[DecisionRecord, ...]
    progress: str = ""


def role_status(
    spec: DeploymentSpec, desired: Mapping[str, int], instances: Sequence[InstanceView]
) -> tuple[RoleStatus, ...]:
    """Desired (the stored target) vs actual (instances by state) per role of ``spec``."""
    statuses = [i.status for i in instances]
    return tuple(
        RoleStatus(r.name, desired.get(r.name, r.replicas), count_of(statuses, r.name))
        for r in spec.roles
    )


def manual_targets(
    spec: DeploymentSpec, desired: Mapping[str, int], role: str, replicas: int
) -> dict[str, int]:
    """Targets with ``role`` at ``replicas``; :class:`UnknownDeployment` for an unknown role,
    :class:`ScaleRefused` outside [min, max] or the P:D ratio bounds. Pure."""
    try:
        r = spec.role(role)
    except KeyError:
        raise UnknownDeployment(f"deployment {spec.name!r} has no role {role!r}") from None
    if not r.min_replicas <= replicas <= r.max_replicas:
        raise ScaleRefused(
            f"replicas {replicas} outside [{r.min_replicas}, {r.max_replicas}] of role {role!r}"
        )
    targets = {x.name: desired.get(x.name, x.replicas) for x in spec.roles}
    targets[role] = replicas
    if not ratio_ok(spec, targets):
        c = spec.coordination
        raise ScaleRefused(
            f"{role}={replicas} breaks the P:D ratio bounds [{c.min_pd_ratio:g}, "
            f"{c.max_pd_ratio:g}] with {targets}"
        )
    return targets


class Deployments:
    def __init__(
        self,
        store: AutoscalerStore,
        reconciler: Reconciler,
        loop: PlannerLoop,
        *,
        advisory: bool,
        wall: Callable[[], float],
        scope: Scope = EVERY,
    ) -> None:
        self._scope = scope
        self._store = store
        self._reconciler = reconciler
        self._loop = loop
        self._advisory = advisory
        self._wall = wall

    async def apply(self, spec: DeploymentSpec) -> tuple[DeploymentSpec, bool]:
        """Store ``spec`` (a new generation when it changed) and hand its desired counts
        (the spec's replicas before any decision) to the reconciler, so the deployment
        exists at once, with or without the planner loop (not in advisory mode, nor for a
        deployment outside the scope: stored for the autoscaler that manages it)."""
        stored, changed = await self._store.apply(spec)
        if changed:
            await self._hand_over(stored.name, f"apply: generation {stored.generation}")
        return stored, changed

    async def resume(self) -> int:
        """Hand every managed stored deployment's desired counts to the reconciler (service
        start: the reconciler starts empty). Returns how many."""
        stored = [d for d in await self._store.all() if self._scope.manages(d.spec.name)]
        for d in stored:
            await self._hand_over(d.spec.name, "resume: autoscaler started")
        return len(stored)

    async def _hand_over(self, name: str, reason: str) -> None:
        stored = await self._store.get(name)
        if stored is None or self._advisory or not self._scope.manages(name):
            return
        targets = {r.name: stored.desired.get(r.name, r.replicas) for r in stored.spec.roles}
        await self._reconciler.apply(stored.spec, targets, (), reason=reason)

    async def get(self, name: str, decisions: int = 5) -> DeploymentView:
        stored = await self._store.get(name)
        if stored is None:
            raise UnknownDeployment(f"no deployment {name!r}")
        instances = tuple(self._reconciler.instances(name))
        return DeploymentView(
            stored.spec,
            role_status(stored.spec, stored.desired, instances),
            instances,
            tuple(await self._store.decisions(name, decisions)),
            self._reconciler.progress(name),
        )

    async def all(self) -> list[DeploymentView]:
        out = []
        for d in await self._store.all():
            instances = tuple(self._reconciler.instances(d.spec.name))
            out.append(
                DeploymentView(d.spec, role_status(d.spec, d.desired, instances), instances, ())
            )
        return out

    async def delete(self, name: str) -> None:
        """Drain and remove every instance, then forget the spec. Idempotent. Outside the
        scope nothing is drained here (the managing autoscaler's next tick finds it gone)."""
        stored = await self._store.get(name)
        if stored is None:
            return
        victims = [
            i.instance_id
            for r in stored.spec.roles
            for i in active(self._reconciler.instances(name), r.name)
        ]
        if not self._advisory and self._scope.manages(name):
            await self._reconciler.apply(
                stored.spec, {r.name: 0 for r in stored.spec.roles}, victims, reason="delete"
            )
        await self._store.delete(name)

    async def scale(
        self, name: str, role: str, replicas: int, *, pin: bool = False, release: bool = False
    ) -> DecisionRecord:
        """Manual scale: ``role`` to ``replicas`` now; with ``pin`` held there by every
        policy until a changed apply or a ``release``, which unpins and changes nothing now."""
        stored = await self._store.get(name)
        if stored is None:
            raise UnknownDeployment(f"no deployment {name!r}")
        self._scope.check(name)
        if release:
            if role not in {r.name for r in stored.spec.roles}:
                raise UnknownDeployment(f"deployment {name!r} has no role {role!r}")
            await self._store.set_pin(name, role, None)
            held = stored.pins.get(role)
            why = f"manual: {role} released (was pinned at {held})" if held is not None else (
                f"manual: {role} was not pinned"
            )  # fmt: skip
            return await self._record(stored.spec, (), why, "applied", ())
        targets = manual_targets(stored.spec, stored.desired, role, replicas)
        instances = self._reconciler.instances(name)
        victims = tuple(pick_victims(instances, role, replicas))
        before = stored.desired.get(role, stored.spec.role(role).replicas)
        reasons = [f"manual: {role} {before} -> {replicas}" + (", pinned" if pin else "")]
        status = "dry-run" if self._advisory else "applied"
        if not self._advisory:
            try:
                await self._reconciler.apply(stored.spec, targets, victims, reason=reasons[0])
            except ReconcileError as exc:
                status = "failed"
                reasons.append(f"reconciler: {exc}")
        if status != "failed":
            await self._store.set_desired(name, targets)
            if pin:
                await self._store.set_pin(name, role, replicas)
        changes = (RoleChange(role, before, replicas),) if before != replicas else ()
        return await self._record(stored.spec, changes, reasons, status, victims)

    async def _record(
        self,
        spec: DeploymentSpec,
        changes: tuple[RoleChange, ...],
        reasons: str | list[str],
        status: str,
        victims: tuple[str, ...],
    ) -> DecisionRecord:
        record = DecisionRecord(
            decision_id=uuid.uuid4().hex,
            deployment=spec.name,
            generation=spec.generation,
            ts_ms=int(self._wall() * 1000),
            changes=changes,
            reasons=(reasons,) if isinstance(reasons, str) else tuple(reasons),
            binding_constraint="manual",
            status=status,
            victims=victims,
        )
        await self._store.add_decision(record)
        return record

    async def plan(self, name: str) -> Decision:
        if await self._store.get(name) is not None:
            self._scope.check(name)
        decision = await self._loop.plan(name)
        if decision is None:
            raise UnknownDeployment(f"no deployment {name!r}")
        return decision

    def instances(self, name: str) -> Sequence[InstanceView]:
        return self._reconciler.instances(name)

    async def decisions(self, name: str, limit: int) -> list[DecisionRecord]:
        return await self._store.decisions(name, limit)
