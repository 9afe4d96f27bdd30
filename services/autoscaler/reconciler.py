"""The reconciler: drives each deployment's actual instances toward its desired target
through one driver, and tells the scheduler (membership events) what changed.

Public surface (the autoscaler's ``Reconciler`` port adapts to it):

- :meth:`Reconciler.apply` ``(target, victims)``: record the desired state and return at
  once (never blocks the caller's loop); a newer target for the same deployment wins;
- :meth:`Reconciler.instances` ``(deployment)``: what the driver has (``ListInstances``);
- :meth:`Reconciler.status` ``(deployment)``: desired vs actual per role, the last driver
  error and the next retry, and :attr:`DeploymentStatus.summary` ("converged", "applying:
  ...", "half-applied: ..." with the error) for ``describe``;
- :meth:`start` / :meth:`stop`.

One task per deployment runs :func:`~services.autoscaler.reconcile_core.plan_steps` (order:
dependencies, maxSkew) on the driver's instances and hands each step to the driver in a task
per role, so a long drain of one role never holds up another role or another deployment. It
re-plans on a new target, on any instance state change (the driver's listener) and every
``resync_s``. A driver error for a role is kept as state (``last_error``) and retried after
an exponential back-off (``retry_base_s`` doubling to ``retry_max_s``); a success clears it.
Membership events are published from the listener (:mod:`services.autoscaler.membership`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from services.autoscaler.drivers.settings import DriverSettings
from services.autoscaler.membership import MembershipPublisher, to_event
from services.autoscaler.reconcile_core import RoleCount, Step, count_roles, plan_steps
from services.common.planner.driver_base import (
    DeploymentTarget,
    Driver,
    DriverError,
    InstanceState,
    InstanceStatus,
    backoff_s,
)

__all__ = ["DeploymentStatus", "Reconciler", "RoleStatus"]

log = logging.getLogger(__name__)

_NOT_SERVING = frozenset({InstanceState.STARTING, InstanceState.FAILED})


@dataclass(frozen=True)
class RoleStatus:
    """One role: ``desired`` replicas, its instances by state, why it waits (if it does),
    the last driver error ("" after a success), when it is retried (monotonic s, 0 = not
    scheduled), and ``instance_errors`` ("id: error" of instances not serving because of a
    failure: a crash loop, a process that will not start, a pod stuck Pending)."""

    name: str
    desired: int
    count: RoleCount
    waiting: str = ""
    last_error: str = ""
    failures: int = 0
    retry_at: float = 0.0
    instance_errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeploymentStatus:
    """A deployment's desired vs actual, for ``describe``."""

    name: str
    roles: tuple[RoleStatus, ...]
    reason: str = ""

    @property
    def converged(self) -> bool:
        return all(_settled(r) for r in self.roles)

    @property
    def summary(self) -> str:
        """ "converged", "applying: ..." while on the way, "half-applied: ..." when a driver
        error or a failed instance holds it."""
        if self.converged:
            return "converged"
        parts = []
        broken = False
        for r in self.roles:
            c = r.count
            if _settled(r):
                continue
            part = f"{r.name} {c.ready}/{r.desired} ready"
            extra = [f"{n} {k}" for k, n in (("starting", c.starting), ("draining", c.draining),
                                             ("failed", c.failed)) if n]  # fmt: skip
            if extra:
                part += f" ({', '.join(extra)})"
            if r.waiting:
                part += f"; {r.waiting}"
            if r.last_error:
                part += f"; error x{r.failures}: {r.last_error}"
            if r.instance_errors:
                part += "; " + "; ".join(r.instance_errors)
            broken = broken or bool(r.last_error or r.instance_errors) or c.failed > 0
            parts.append(part)
        return ("half-applied: " if broken else "applying: ") + "; ".join(parts)


def _settled(r: RoleStatus) -> bool:
    """Every desired replica serves, nothing else exists (none draining), no error."""
    c = r.count
    return c.ready == r.desired == c.current and not c.draining and not r.last_error


@dataclass
class _RoleRun:
    task: asyncio.Task[None] | None = None
    asked: Step | None = None
    last_error: str = ""
    failures: int = 0
    retry_at: float = 0.0


@dataclass
class _Deployment:
    target: DeploymentTarget
    victims: Mapping[str, Sequence[str]]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    roles: dict[str, _RoleRun] = field(default_factory=dict)
    waiting: Mapping[str, str] = field(default_factory=dict)


class Reconciler:
    """Desired -> actual through ``driver``; see the module docstring. ``publisher`` None:
    no membership events (tests, dry-run)."""

    def __init__(
        self,
        driver: Driver,
        settings: DriverSettings,
        publisher: MembershipPublisher | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.driver = driver
        self.settings = settings
        self.publisher = publisher
        self._clock = clock
        self._wall = wall
        self._deployments: dict[str, _Deployment] = {}
        self._running = False
        self._steps: set[asyncio.Task[None]] = set()
        driver.set_listener(self._on_change)

    # -- public surface ------------------------------------------------------------------

    async def start(self) -> None:
        if self._running:
            return
        self._running = True
        await self.driver.start()
        for dep in self._deployments.values():
            self._spawn(dep)

    def apply(
        self, target: DeploymentTarget, victims: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        """Make ``target`` the desired state of its deployment (``victims``: per role, the
        instance ids to remove first on scale-in). Returns at once."""
        dep = self._deployments.get(target.name)
        if dep is None:
            dep = self._deployments[target.name] = _Deployment(target, dict(victims or {}))
        else:
            dep.target, dep.victims = target, dict(victims or {})
            for run in dep.roles.values():
                run.retry_at = 0.0  # a new target is worth trying at once
        dep.wake.set()
        if self._running:
            self._spawn(dep)

    def instances(self, deployment: str) -> Sequence[InstanceStatus]:
        return self.driver.instances(deployment)

    def deployments(self) -> list[str]:
        return sorted(self._deployments)

    def status(self, deployment: str) -> DeploymentStatus | None:
        dep = self._deployments.get(deployment)
        if dep is None:
            return None
        instances = self.driver.instances(deployment)
        counts = count_roles(dep.target, instances)
        roles = []
        for r in dep.target.roles:
            run = dep.roles.get(r.name, _RoleRun())
            errors = tuple(
                f"{i.instance_id}: {i.last_error}"
                for i in instances
                if i.role_name == r.name and i.last_error and i.state in _NOT_SERVING
            )
            roles.append(
                RoleStatus(
                    r.name,
                    r.replicas,
                    counts[r.name],
                    dep.waiting.get(r.name, ""),
                    run.last_error,
                    run.failures,
                    run.retry_at,
                    errors,
                )
            )
        return DeploymentStatus(deployment, tuple(roles), dep.target.reason)

    async def stop(self) -> None:
        """Stop reconciling (every step still running is cancelled), then close the driver."""
        self._running = False
        tasks = [d.task for d in self._deployments.values() if d.task is not None]
        tasks += self._steps
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self.driver.close()
        if self.publisher is not None:
            await self.publisher.flush()

    # -- loop ----------------------------------------------------------------------------

    def _spawn(self, dep: _Deployment) -> None:
        if dep.task is None or dep.task.done():
            dep.task = asyncio.create_task(self._run(dep), name=f"reconcile-{dep.target.name}")

    async def _on_change(self, status: InstanceStatus, reason: str) -> None:
        dep = self._deployments.get(status.deployment)
        if dep is not None:
            dep.wake.set()
        if self.publisher is None:
            return
        target_reason = dep.target.reason if dep is not None else ""
        why = f"{reason} ({target_reason})" if target_reason else reason
        event = to_event(status, why, int(self._wall() * 1000))
        if event is not None:
            await self.publisher.publish(event)

    async def _run(self, dep: _Deployment) -> None:
        while self._running:
            dep.wake.clear()
            self._round(dep)
            if self.publisher is not None and self.publisher.pending:
                await self.publisher.flush()
            timeout = self._next_wake(dep)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(dep.wake.wait(), timeout)

    def _next_wake(self, dep: _Deployment) -> float:
        now = self._clock()
        retries = [r.retry_at - now for r in dep.roles.values() if r.retry_at > now]
        return max(0.01, min([self.settings.resync_s, *retries]))

    def _round(self, dep: _Deployment) -> None:
        target = dep.target
        plan = plan_steps(target, self.driver.instances(target.name), dep.victims)
        dep.waiting = plan.waiting
        now = self._clock()
        for step in plan.steps:
            run = dep.roles.setdefault(step.role, _RoleRun())
            busy = run.task is not None and not run.task.done()
            if busy and run.asked == step:
                continue  # already being done
            if run.retry_at > now:
                continue  # backing off after an error
            run.asked = step
            run.task = asyncio.create_task(
                self._scale(dep, run, step), name=f"scale-{target.name}-{step.role}"
            )
            self._steps.add(run.task)  # an older step of the role may still run (a drain)
            run.task.add_done_callback(self._steps.discard)

    async def _scale(self, dep: _Deployment, run: _RoleRun, step: Step) -> None:
        role = dep.target.role(step.role)
        if role is None:
            return
        try:
            await self.driver.scale(role, step.replicas, step.victims)
        except Exception as e:  # DriverError, or a driver bug: kept as state, retried
            if not isinstance(e, DriverError):
                log.exception("%s/%s: driver failed unexpectedly", dep.target.name, step.role)
            run.failures += 1
            run.last_error = str(e)
            delay = backoff_s(run.failures, self.settings.retry_base_s, self.settings.retry_max_s)
            run.retry_at = self._clock() + delay
            log.warning(
                "%s/%s: scaling to %d failed (%s); retry in %.1fs",
                dep.target.name,
                step.role,
                step.replicas,
                e,
                delay,
            )
        else:
            run.failures, run.last_error, run.retry_at = 0, "", 0.0
        finally:
            if run.asked == step:
                run.asked = None
            dep.wake.set()
