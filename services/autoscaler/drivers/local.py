"""The ``local`` driver: engine processes on this machine.

Each instance is one process (the tideserve engine simulator, or the role's own command line
with ``{port}``/``{host}``/``{instance_id}``/``{role}``/``{deployment}`` substituted, e.g.
``python -m sglang.launch_server --port {port}`` or ``vllm serve M --port {port}``), started
in its own session with its output in ``<state_dir>/logs/<instance>.log``, with the id
``instance_id_format`` (default ``{deployment}-{role}-{n}``, ``n`` counting per role), on
the first of the role's own ``ports`` no live instance holds, else a free port from ``port_min..port_max``.
Every instance's latest process is recorded (pid and start time) in
``<state_dir>/instances.json``
(:mod:`services.common.local.recorded`): engines outlive a SIGKILLed driver, so :meth:`start`
takes the live ones an earlier run recorded as orphans, which the next :meth:`scale` of
their role adopts instead of launching new processes (warm caches, same ids; the rest are
stopped: :mod:`.adopt`), and ``tideserve down`` stops them from the same record. One asyncio
task supervises them all (no threads):

- STARTING -> READY when ``GET {endpoint}{readiness_path}`` answers 2xx (``ready_ms`` minus
  ``started_ms`` is the measured start-up time); not ready within ``startup_timeout_s``:
  stopped and handled as a crash;
- a crash (the process exits while not being stopped) -> FAILED with the exit code and the
  log's last line as ``last_error``; with the role's restart policy ``always`` restarted on
  the same port and id after an exponential back-off (``restart_base_s`` doubling to
  ``restart_max_s``), forever (a range port another process took meanwhile is exchanged
  for a free one, the id kept): a role that never starts shows FAILED with its ``restarts``
  and error, and never blocks :meth:`scale`; with ``never`` it stays FAILED (and counted, so
  it is not replaced either) until scaled away;
- sidecars (the role's ``sidecars``, e.g. a real engine's kv-bridge): started with the
  instance, started again when they exit, kept across the instance's restarts (a bridge then
  sees the engine come back), stopped after it (:mod:`.sidecars`);
- scale-in: victims are drained first (DRAINING announced, the scheduler's ``Drain``, a
  bounded wait until nothing is in flight: :class:`~.drain.Drainer`), their agent sessions
  migrated (:meth:`~.drain.Drainer.migrate`, with kvmeta configured), then SIGTERM, then
  SIGKILL after ``stop_grace_s``.

:meth:`close` stops every process (SIGTERM, SIGKILL after the grace) without draining: the
driver's processes do not outlive it. The driver owns the drainer it is given and closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from services.autoscaler.drivers.adopt import AdoptedChild, Orphans
from services.autoscaler.drivers.argv import render_argv, render_sidecars
from services.autoscaler.drivers.drain import Drainer
from services.autoscaler.drivers.portpick import choose_port
from services.autoscaler.drivers.sessions import peers_of
from services.autoscaler.drivers.settings import LocalSettings
from services.autoscaler.drivers.sidecars import Sidecars
from services.common.local.ports import port_is_free
from services.common.local.procs import Child, Supervisor, log_tail, signal_process
from services.common.local.recorded import RecordedEngine, write_recorded
from services.common.local.spec import ChildSpec
from services.common.planner.driver_base import (
    DriverError,
    InstanceState,
    InstanceStatus,
    Listener,
    RoleTarget,
    backoff_s,
    choose_victims,
    counted,
)

__all__ = ["LocalDriver"]

log = logging.getLogger(__name__)


@dataclass
class _Instance:
    """What the driver keeps per instance (mutable shell state; ``status`` is frozen)."""

    status: InstanceStatus
    target: RoleTarget
    port: int
    child: Child | AdoptedChild | None = None
    failures: int = 0  # consecutive
    restart_at: float = 0.0  # monotonic; when a FAILED instance is started again
    started_at: float = 0.0  # monotonic
    stopping: bool = False
    sidecars: Sidecars | None = None


class LocalDriver:
    """Engine processes supervised by one asyncio task; see the module docstring."""

    name = "local"

    def __init__(
        self,
        settings: LocalSettings,
        drainer: Drainer,
        *,
        python: str = sys.executable,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.drainer = drainer
        self.python = python
        self._clock = clock
        self._wall = wall
        self._listener: Listener | None = None
        self._instances: dict[str, _Instance] = {}
        self._procs = Supervisor(stop_timeout_s=settings.stop_grace_s)
        self._seq: dict[tuple[str, str], itertools.count[int]] = {}
        self._task: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._state_dir = Path(settings.state_dir or tempfile.mkdtemp(prefix="ts-local-"))
        self._lock = asyncio.Lock()  # one scale() at a time: counts stay consistent
        self._orphans = Orphans()

    def set_listener(self, listener: Listener) -> None:
        self._listener = listener

    @property
    def state_dir(self) -> Path:
        return self._state_dir

    def instances(self, deployment: str) -> Sequence[InstanceStatus]:
        return [
            i.status
            for i in self._instances.values()
            if i.status.deployment == deployment and i.status.state != InstanceState.STOPPED
        ]

    def log_path(self, instance_id: str) -> Path:
        return self._state_dir / "logs" / f"{instance_id}.log"

    async def start(self) -> None:
        if self._task is None:
            self._take_orphans()
            self._http = aiohttp.ClientSession()
            self._task = asyncio.create_task(self._supervise(), name="local-driver")

    def _take_orphans(self) -> None:
        """Keep the live engines an earlier run left running, for :meth:`scale` to adopt."""
        self._orphans = Orphans.load(self._state_dir)

    async def _stop_orphans(self, deployment: str | None, role_name: str | None) -> None:
        await self._orphans.stop(deployment, role_name, self.settings.stop_grace_s)

    def _record(self) -> None:
        """Rewrite ``instances.json`` with every instance's latest process (after each start,
        crash and stop): a FAILED one keeps its dead pid, so a reader sees it is not alive."""
        live = [
            RecordedEngine(
                instance_id=i.status.instance_id,
                deployment=i.status.deployment,
                role_name=i.status.role_name,
                role=i.status.role.value,
                endpoint=i.status.endpoint,
                pid=i.child.ref.pid,
                create_time=i.child.ref.create_time,
                log=str(self.log_path(i.status.instance_id)),
            )
            for i in self._instances.values()
            if i.child is not None
        ]
        try:
            write_recorded(self._state_dir, os.getpid(), live)
        except OSError as e:  # supervision goes on; only the after-SIGKILL clean-up suffers
            log.error("local driver: cannot record engine pids in %s: %s", self._state_dir, e)

    # -- state changes -------------------------------------------------------------------

    async def _set(self, inst: _Instance, reason: str, **changes: object) -> None:
        inst.status = replace(inst.status, **changes)  # type: ignore[arg-type]
        if self._listener is not None:
            try:
                await self._listener(inst.status, reason)
            except Exception:  # a listener failure must not stop supervision
                log.exception("local driver: listener failed for %s", inst.status.instance_id)

    def _now_ms(self) -> int:
        return int(self._wall() * 1000)

    # -- scale ---------------------------------------------------------------------------

    async def scale(self, role: RoleTarget, replicas: int, victims: Sequence[str] = ()) -> None:
        if replicas < 0:
            raise DriverError(f"role {role.name}: replicas {replicas} is negative")
        async with self._lock:
            mine = [i.status for i in self._instances.values() if not i.stopping]
            have = counted([i for i in mine if i.deployment == role.deployment], role.name)
            if len(have) < replicas:
                for _ in range(replicas - len(have)):
                    await self._launch_new(role)
                await self._stop_orphans(role.deployment, role.name)
                return
            await self._stop_orphans(role.deployment, role.name)
            doomed = choose_victims(have, len(have) - replicas, victims)
        limit = role.drain_limit_s
        await asyncio.gather(*(self._remove(self._instances[v], limit) for v in doomed))

    def _free_port(self, role: RoleTarget) -> int:
        taken = {i.port for i in self._instances.values() if not i.stopping}
        return choose_port(role, taken, self.settings)

    def _new_id(self, role: RoleTarget) -> str:
        """``instance_id_format`` with the role's next number (never reused while the driver
        runs, so a new instance never takes over an old one's id; skips ids in use)."""
        seq = self._seq.setdefault((role.deployment, role.name), itertools.count(1))
        while True:
            iid = self.settings.instance_id_format.format(
                deployment=role.deployment, role=role.name, n=next(seq)
            )
            if iid not in self._instances:
                return iid

    async def _launch_new(self, role: RoleTarget) -> None:
        orphan = self._orphans.take(role.deployment, role.name)
        if orphan is not None:
            await self._adopt(role, orphan)
            return
        port = self._free_port(role)
        iid = self._new_id(role)
        status = InstanceStatus(
            instance_id=iid,
            deployment=role.deployment,
            role_name=role.name,
            role=role.role,
            state=InstanceState.STARTING,
            endpoint=f"http://{self.settings.host}:{port}",
            engine_kind=role.engine_kind,
        )
        inst = _Instance(status, role, port)
        self._exec(inst)  # raises DriverError before the instance is recorded
        self._instances[iid] = inst
        self._record()
        await self._set(inst, "launched", started_ms=self._now_ms())

    async def _adopt(self, role: RoleTarget, engine: RecordedEngine) -> None:
        status = InstanceStatus(
            instance_id=engine.instance_id,
            deployment=role.deployment,
            role_name=role.name,
            role=role.role,
            state=InstanceState.STARTING,
            endpoint=engine.endpoint,
            engine_kind=role.engine_kind,
        )
        port = urlsplit(engine.endpoint).port or 0
        inst = _Instance(status, role, port, child=AdoptedChild.of(engine))
        inst.started_at = self._clock()
        self._instances[engine.instance_id] = inst
        self._record()
        log.info("local driver: adopted %s (pid %d)", engine.instance_id, engine.pid)
        await self._set(inst, "adopted from an earlier run", started_ms=self._now_ms())

    def _exec(self, inst: _Instance) -> None:
        iid = inst.status.instance_id
        argv = render_argv(
            inst.target,
            host=self.settings.host,
            port=inst.port,
            instance_id=iid,
            state_dir=self._state_dir / "engines",
            python=self.python,
        )
        env = {**_base_env(), **inst.target.env, "PYTHONUNBUFFERED": "1"}
        if inst.sidecars is None and inst.target.sidecars:
            sidecar_argvs = render_sidecars(
                inst.target,
                host=self.settings.host,
                port=inst.port,
                instance_id=iid,
                state_dir=self._state_dir / "engines",
            )
            inst.sidecars = Sidecars(
                iid, sidecar_argvs, env, self.log_path(iid).parent, self._procs
            )
        (self._state_dir / "engines" / iid).mkdir(parents=True, exist_ok=True)
        spec = ChildSpec(name=iid, argv=argv, env=env, log_path=self.log_path(iid), kind="engine")
        try:
            inst.child = self._procs.start(spec)
        except OSError as e:
            raise DriverError(f"{iid}: cannot start {argv[0]!r}: {e}") from e
        inst.started_at = self._clock()
        if inst.sidecars is not None:
            inst.sidecars.start()

    async def _remove(self, inst: _Instance, drain_limit_s: float | None = None) -> None:
        """Drain (when it may be serving; at most ``drain_limit_s``, None = the drainer's
        timeout), then stop; STOPPED at the end."""
        if inst.stopping:
            return
        inst.stopping = True
        iid = inst.status.instance_id
        if inst.status.state == InstanceState.READY:
            await self._set(inst, "scale-in: draining", state=InstanceState.DRAINING)
            res = await self.drainer.drain(iid, inst.status.endpoint, drain_limit_s)
            if not res.drained:
                log.warning(
                    "%s: still %d in flight after %.1fs of draining; stopping anyway",
                    iid,
                    res.in_flight,
                    res.waited_s,
                )
            why = (
                f"scale-in: drained in {res.waited_s:.1f}s"
                if res.drained
                else (
                    f"scale-in: drain timed out after {res.waited_s:.1f}s ({res.in_flight} in flight)"
                )
            )
            stay = [i.status for i in self._instances.values() if not i.stopping]
            moved = await self.drainer.migrate(inst.status, peers_of(inst.status, stay))
            if moved:
                why += f"; {moved}"
        else:
            why = f"scale-in: removed while {inst.status.state.value}"
        await self._terminate(inst)
        await self._set(inst, why, state=InstanceState.STOPPED)
        self._instances.pop(iid, None)
        self._record()

    async def _terminate(self, inst: _Instance) -> None:
        """SIGTERM, wait ``stop_grace_s``, SIGKILL; returns once the process is gone, and
        then its sidecars."""
        await self._terminate_engine(inst)
        if inst.sidecars is not None:
            await inst.sidecars.stop(self.settings.stop_grace_s)

    async def _terminate_engine(self, inst: _Instance) -> None:
        child = inst.child
        if child is None or child.exit_code() is not None:
            return
        signal_process(child.ref, signal.SIGTERM)
        if not await self._exited(child, self.settings.stop_grace_s):
            log.warning(
                "%s: no exit %gs after SIGTERM; SIGKILL",
                child.spec.name,
                self.settings.stop_grace_s,
            )
            signal_process(child.ref, signal.SIGKILL)
            await self._exited(child, 30.0)

    async def _exited(self, child: Child | AdoptedChild, within_s: float) -> bool:
        """Poll (and reap) ``child`` until it exits or ``within_s`` passes."""
        deadline = self._clock() + within_s
        while True:
            if child.exit_code() is not None:
                return True
            if self._clock() >= deadline:
                return False
            await asyncio.sleep(0.05)

    # -- supervision ---------------------------------------------------------------------

    async def _supervise(self) -> None:
        while True:
            for inst in list(self._instances.values()):
                try:
                    await self._check(inst)
                except Exception:  # never let one instance stop the supervision of all
                    log.exception("local driver: checking %s failed", inst.status.instance_id)
            await asyncio.sleep(self.settings.probe_interval_s)

    async def _check(self, inst: _Instance) -> None:
        if inst.stopping:
            return
        state = inst.status.state
        if state == InstanceState.FAILED:
            if inst.target.restart == "always" and self._clock() >= inst.restart_at:
                await self._restart(inst)
            return
        assert inst.child is not None
        if inst.sidecars is not None:
            inst.sidecars.revive()
        code = inst.child.exit_code()
        if code is not None:
            tail = log_tail(self.log_path(inst.status.instance_id), 1)
            await self._crashed(inst, f"exited with code {code}" + (f": {tail}" if tail else ""))
            return
        if state == InstanceState.STARTING:
            if await self._ready(inst):
                await self._set(inst, "ready", state=InstanceState.READY, ready_ms=self._now_ms())
                inst.failures = 0
            elif self._clock() - inst.started_at > inst.target.startup_timeout_s:
                await self._terminate_engine(inst)
                await self._crashed(inst, f"not ready within {inst.target.startup_timeout_s:g}s")

    async def _ready(self, inst: _Instance) -> bool:
        assert self._http is not None
        url = inst.status.endpoint + inst.target.readiness_path
        try:
            async with self._http.get(url, timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                return 200 <= r.status < 300
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def _crashed(self, inst: _Instance, error: str) -> None:
        inst.failures += 1
        self._record()
        if inst.target.restart == "never":
            log.error(
                "%s: %s (restart policy never: it stays FAILED)", inst.status.instance_id, error
            )
            await self._set(
                inst, f"crashed: {error}", state=InstanceState.FAILED, last_error=error, ready_ms=0
            )
            return
        s = self.settings
        delay = backoff_s(inst.failures, s.restart_base_s, s.restart_max_s)
        inst.restart_at = self._clock() + delay
        level = logging.ERROR if inst.failures >= s.failures_to_surface else logging.WARNING
        log.log(
            level,
            "%s: %s (failure %d in a row; restart in %.1fs)",
            inst.status.instance_id,
            error,
            inst.failures,
            delay,
        )
        await self._set(
            inst,
            f"crashed: {error}",
            state=InstanceState.FAILED,
            last_error=error,
            ready_ms=0,
        )

    async def _move_if_taken(self, inst: _Instance) -> None:
        """A range port another process took while the instance was down is not waited
        for: the restart takes the next free one (membership updates the address by id)
        and its sidecars start again with it. A role's own port stays, and the restart
        fails on it loudly."""
        s = self.settings
        if inst.port in inst.target.ports or port_is_free(s.host, inst.port):
            return
        old = inst.port
        inst.port = self._free_port(inst.target)
        inst.status = replace(inst.status, endpoint=f"http://{s.host}:{inst.port}")
        log.warning(
            "%s: port %d was taken by another process; restarting on %d",
            inst.status.instance_id, old, inst.port,
        )  # fmt: skip
        if inst.sidecars is not None:
            await inst.sidecars.stop(s.stop_grace_s)
            inst.sidecars = None

    async def _restart(self, inst: _Instance) -> None:
        try:
            await self._move_if_taken(inst)
            self._exec(inst)
        except DriverError as e:
            await self._crashed(inst, str(e))
            return
        self._record()
        await self._set(
            inst,
            f"restarted after failure {inst.failures}",
            state=InstanceState.STARTING,
            started_ms=self._now_ms(),
            restarts=inst.status.restarts + 1,
        )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await asyncio.gather(*(self._terminate(i) for i in self._instances.values()))
        await self._stop_orphans(None, None)
        for inst in self._instances.values():
            inst.stopping = True
            await self._set(inst, "driver closed", state=InstanceState.STOPPED)
        self._instances.clear()
        self._record()
        await self.drainer.close()
        if self._http is not None:
            await self._http.close()
            self._http = None


def _base_env() -> dict[str, str]:
    """The environment engines inherit (read at launch, never at import)."""
    return dict(os.environ)
