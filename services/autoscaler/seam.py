"""The seam between the planner's :class:`~services.common.planner.ports.Reconciler` port and the
drivers' :class:`~services.autoscaler.reconciler.Reconciler`.

One instance type: a driver's :class:`~services.common.planner.driver_base.InstanceStatus`. The
planner sees it as an :class:`~services.common.planner.ports.InstanceView`: the status plus the
load the driver does not know (running and queued requests from the engine's ``/metrics``,
scraped by :class:`LoadPoller`) and the KV of the agent sessions homed on it (kvmeta's
``ListSessionHomes``, asked by :class:`SessionKVPoller` when kvmeta is configured, else 0):
the live sessions' blocks (victim cost) and the active sessions' tokens (scale-in floor).
``cached_blocks`` stays 0: no engine reports a count of cached blocks it would lose
(``kv_usage`` is a fraction of its pool, not a prefix cache).

Pure translations:

- :func:`role_target` / :func:`deployment_target`: a spec role and its target replicas ->
  ``RoleTarget`` (engine ``sim``: the simulator with the role's ``args``; ``sglang``/``vllm``:
  the role's ``template`` as a command line with ``{host}``/``{port}``/... placeholders, else
  :data:`ENGINE_COMMANDS`), ``coordination.max_skew_percent`` -> ``max_skew`` as a fraction
  (0 = uncoordinated, 1.0), ``coordination.drain_timeout_s`` -> each role's
  ``drain_timeout_s`` (bounds the drain of its instances; 0 = the driver's setting);
- :func:`victims_by_role`: the planner's flat victim list -> ``{role: [ids]}``.

:class:`DriverReconciler` implements the port over the real reconciler (refusing a
deployment outside ``managed_deployments``, :mod:`~services.autoscaler.scope`): ``apply`` returns
once the target is recorded (the reconciler drives it in its own tasks), ``instances`` is the
driver's snapshot with the last scraped load, ``progress`` is the reconciler's
"converged"/"applying: ..."/"half-applied: ..." line for ``describe`` (with the
``dry-run`` driver, which owns nothing: "dry-run: desired recorded (...), nothing changed").
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol

import aiohttp
import grpc

from services.autoscaler.drivers.dryrun import DryRunDriver
from services.autoscaler.drivers.sessions import HomeLoad
from services.autoscaler.reconciler import Reconciler as DriverLoop
from services.autoscaler.scope import EVERY, Scope
from services.common.engine_load import LoadReport, scrape_load
from services.common.planner.driver_base import DeploymentTarget, InstanceState, Role, RoleTarget
from services.common.planner.ports import InstanceView, ReconcileError
from services.common.planner.spec import DeploymentSpec, RoleSpec
from services.common.tasks import pause, stop_tasks

__all__ = [
    "ENGINE_COMMANDS",
    "DriverReconciler",
    "LoadPoller",
    "SessionHomes",
    "SessionKVPoller",
    "deployment_target",
    "role_target",
    "victims_by_role",
]

log = logging.getLogger(__name__)

ENGINE_COMMANDS: Mapping[str, tuple[str, ...]] = {
    "sglang": ("python", "-m", "sglang.launch_server", "--host", "{host}", "--port", "{port}"),
    "vllm": ("vllm", "serve", "--host", "{host}", "--port", "{port}"),
}
"""Command lines of real engines when a role gives no ``template`` (its ``args`` follow)."""


def role_target(
    deployment: str, role: RoleSpec, replicas: int, drain_timeout_s: float = 0.0
) -> RoleTarget:
    """``role`` of ``deployment`` at ``replicas`` as a driver needs it (pure);
    ``drain_timeout_s``: the spec's ``coordination.drain_timeout_s`` (0 = the driver's)."""
    command: tuple[str, ...] = ()
    if role.engine != "sim":
        command = tuple(shlex.split(role.template)) or ENGINE_COMMANDS[role.engine]
    target = RoleTarget(
        deployment=deployment,
        name=role.name,
        role=Role(role.role),
        replicas=replicas,
        engine_kind=role.engine,
        command=command,
        args=role.args,
        image=role.image,
        resources=dict(role.resources),
        dependencies=role.dependencies,
        restart=role.restart_policy,
        ports=role.ports,
        drain_timeout_s=drain_timeout_s,
        sidecars=tuple(tuple(shlex.split(c)) for c in role.sidecars),
    )
    if role.startup_timeout_s:
        target = replace(target, startup_timeout_s=role.startup_timeout_s)
    return target


def deployment_target(
    spec: DeploymentSpec, targets: Mapping[str, int], reason: str = ""
) -> DeploymentTarget:
    """Every role of ``spec`` at ``targets[role]`` (the spec's replicas when absent)."""
    drain = spec.coordination.drain_timeout_s
    roles = tuple(
        role_target(spec.name, r, targets.get(r.name, r.replicas), drain) for r in spec.roles
    )
    skew = spec.coordination.max_skew_percent / 100.0
    return DeploymentTarget(spec.name, roles, max_skew=skew if skew > 0 else 1.0, reason=reason)


def victims_by_role(
    victims: Sequence[str], instances: Sequence[InstanceView]
) -> dict[str, list[str]]:
    """The flat victim list grouped by each victim's role (unknown ids dropped: gone)."""
    role_of = {i.instance_id: i.role for i in instances}
    out: dict[str, list[str]] = {}
    for v in victims:
        if v in role_of:
            out.setdefault(role_of[v], []).append(v)
    return out


class LoadPoller:
    """Scrapes every READY instance's ``/metrics`` each ``interval_s`` and keeps the last
    :class:`LoadReport` per instance (instances that disappeared are forgotten)."""

    def __init__(self, loop: DriverLoop, interval_s: float, timeout_s: float) -> None:
        self._loop = loop
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self.loads: dict[str, LoadReport] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def poll_once(self, session: aiohttp.ClientSession) -> None:
        ready = [
            s
            for d in self._loop.deployments()
            for s in self._loop.instances(d)
            if s.state == InstanceState.READY and s.endpoint
        ]
        reports = await asyncio.gather(
            *(scrape_load(session, s.endpoint, self._timeout_s) for s in ready)
        )
        self.loads = {s.instance_id: r for s, r in zip(ready, reports, strict=True) if r}

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as session:
            while not self._stopping.is_set():
                await self.poll_once(session)
                await pause(self._stopping, self._interval_s)

    def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._run(), name="instance-load")

    async def stop(self) -> None:
        if self._task is not None:
            self._stopping.set()
            await stop_tasks([self._task])
            self._task = None


class SessionHomes(Protocol):
    """Session KV per instance of a deployment
    (:class:`~services.autoscaler.drivers.sessions.KVMetaSessions`); raises AioRpcError."""

    async def homes(self, deployment: str) -> dict[str, HomeLoad]: ...


class SessionKVPoller:
    """Asks kvmeta each ``interval_s`` for the session KV per instance of every deployment
    the reconciler drives, and keeps the last answer per deployment (a deployment kvmeta
    could not be asked about keeps its previous answer)."""

    def __init__(self, loop: DriverLoop, kvmeta: SessionHomes, interval_s: float) -> None:
        self._loop = loop
        self._kvmeta = kvmeta
        self._interval_s = interval_s
        self.blocks: dict[str, dict[str, HomeLoad]] = {}  # deployment -> instance -> load
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def poll_once(self) -> None:
        names = list(self._loop.deployments())
        for name in names:
            try:
                self.blocks[name] = await self._kvmeta.homes(name)
            except grpc.aio.AioRpcError as e:
                log.debug("session KV of %s: kvmeta answered %s", name, e.code().name)
        for gone in set(self.blocks) - set(names):
            del self.blocks[gone]

    def of(self, deployment: str, instance_id: str) -> HomeLoad:
        return self.blocks.get(deployment, {}).get(instance_id, HomeLoad())

    async def _run(self) -> None:
        while not self._stopping.is_set():
            await self.poll_once()
            await pause(self._stopping, self._interval_s)

    def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._run(), name="session-kv")

    async def stop(self) -> None:
        if self._task is not None:
            self._stopping.set()
            await stop_tasks([self._task])
            self._task = None


class DriverReconciler:
    """The port over the drivers' reconciler (``loop``); see the module docstring."""

    def __init__(
        self,
        loop: DriverLoop,
        load: LoadPoller | None = None,
        scope: Scope = EVERY,
        sessions: SessionKVPoller | None = None,
    ) -> None:
        self.loop = loop
        self._load = load
        self._scope = scope
        self._sessions = sessions

    async def start(self) -> None:
        await self.loop.start()
        if self._load is not None:
            self._load.start()
        if self._sessions is not None:
            self._sessions.start()

    async def stop(self) -> None:
        """Stop polling and reconciling; the local driver stops its engines."""
        if self._sessions is not None:
            await self._sessions.stop()
        if self._load is not None:
            await self._load.stop()
        await self.loop.stop()

    async def apply(
        self,
        spec: DeploymentSpec,
        targets: Mapping[str, int],
        victims: Sequence[str],
        reason: str = "",
    ) -> None:
        """:class:`ReconcileError` for a deployment outside the scope (never driven here)."""
        if not self._scope.manages(spec.name):
            raise ReconcileError(f"{spec.name!r} is outside managed_deployments")
        status = self.loop.status(spec.name)
        previous = {r.name: r.desired for r in status.roles} if status is not None else {}
        full = {r.name: targets.get(r.name, previous.get(r.name, r.replicas)) for r in spec.roles}
        grouped = victims_by_role(victims, self.instances(spec.name))
        self.loop.apply(deployment_target(spec, full, reason), grouped)

    def instances(self, deployment: str = "") -> Sequence[InstanceView]:
        names = [deployment] if deployment else self.loop.deployments()
        loads = self._load.loads if self._load is not None else {}
        out = []
        kv = self._sessions
        for name in names:
            for s in self.loop.instances(name):
                r = loads.get(s.instance_id)
                home = kv.of(name, s.instance_id) if kv is not None else HomeLoad()
                running, waiting = (r.running, r.waiting) if r else (0, 0)
                out.append(
                    InstanceView(s, running, waiting, session_blocks=home.blocks,
                                 active_session_tokens=home.active_tokens)
                )  # fmt: skip
        return out

    def progress(self, deployment: str) -> str:
        """The reconciler's progress line ("" for a deployment it never saw)."""
        status = self.loop.status(deployment)
        if status is None:
            return ""
        if isinstance(self.loop.driver, DryRunDriver):  # it owns nothing: never converges
            wanted = ", ".join(f"{r.name} {r.desired}" for r in status.roles)
            return f"dry-run: desired recorded ({wanted}), nothing changed"
        return status.summary
