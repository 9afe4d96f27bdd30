"""An autoscaled gateway in one event loop: the scheduler service (gRPC + OpenAI HTTP gateway,
following ``{prefix}:membership`` on Redis, no static endpoints) and a :class:`Reconciler`
over the :class:`LocalDriver` starting simulated engine processes, draining through the
scheduler's ``Drain``. Used by tests/e2e/test_autoscaler_scale_e2e.py and
benchmarks/scale_latency.py.

:class:`ClosedLoop` keeps ``n`` streamed chat requests in flight through the gateway and
records every outcome; :class:`RecordingDrainer` records what each drain saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import redis.asyncio as aioredis
from tideserve.v1 import scheduler_pb2, scheduler_pb2_grpc

from services.autoscaler.drivers.drain import Drainer, DrainResult
from services.autoscaler.drivers.local import LocalDriver
from services.autoscaler.drivers.settings import DriverSettings, LocalSettings
from services.autoscaler.main import build as build_autoscaler
from services.autoscaler.membership import MembershipPublisher
from services.autoscaler.reconciler import Reconciler
from services.autoscaler.settings import AutoscalerSettings
from services.common.planner.driver_base import DeploymentTarget, InstanceStatus, Role, RoleTarget
from services.common.streams import StreamProducer
from services.scheduler.settings import SchedulerSettings
from tests.helpers.engine_stack import Outcome, stream_sse
from tests.helpers.ports import free_ports, port_range
from tests.helpers.scheduler import scheduler_service, serving

__all__ = [
    "ClosedLoop",
    "RecordingDrainer",
    "Rig",
    "autoscaled_gateway",
    "autoscaler_service",
    "gateway_settings",
    "tideserve",
]

SIM_ARGS = ("--profile", "test", "--kv-blocks", "512")


class RecordingDrainer(Drainer):
    """A :class:`Drainer` that keeps ``(instance_id, result)`` of every drain, the
    ``timeout_s`` each drain was given (None = the drainer's own), and ``(instance_id,
    peer ids)`` of every session migration asked for after a drain."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.results: list[tuple[str, DrainResult]] = []
        self.limits: list[float | None] = []
        self.migrations: list[tuple[str, list[str]]] = []

    async def migrate(self, victim: InstanceStatus, peers: Sequence[InstanceStatus]) -> str:
        self.migrations.append((victim.instance_id, sorted(p.instance_id for p in peers)))
        return await super().migrate(victim, peers)

    async def drain(
        self, instance_id: str, endpoint: str, timeout_s: float | None = None
    ) -> DrainResult:
        self.limits.append(timeout_s)
        res = await super().drain(instance_id, endpoint, timeout_s)
        self.results.append((instance_id, res))
        return res


@dataclass
class Rig:
    reconciler: Reconciler
    driver: LocalDriver
    drainer: RecordingDrainer
    gateway: str  # http://127.0.0.1:PORT
    scheduler: str  # gRPC host:port
    deployment: str
    stream: str
    redis: aioredis.Redis
    engine_args: tuple[str, ...] = SIM_ARGS
    prefix: str = ""
    role: RoleTarget | None = None  # the worker role (replicas aside); None = the simulator

    def target(self, replicas: int, reason: str = "") -> DeploymentTarget:
        if self.role is not None:
            role = replace(self.role, deployment=self.deployment, replicas=replicas)
        else:
            role = RoleTarget(
                self.deployment, "worker", Role.WORKER, replicas, args=self.engine_args,
                startup_timeout_s=60.0,
            )  # fmt: skip
        return DeploymentTarget(self.deployment, (role,), reason=reason)

    async def serving(self) -> set[str]:
        """Instances the gateway would route to now (healthy, not draining)."""
        return {
            e.instance.instance_id for e in await self._endpoints() if e.healthy and not e.draining
        }

    async def in_flight(self, instance_id: str) -> int:
        """Requests the gateway has in flight on ``instance_id`` now (0 when it is unknown)."""
        counts = {e.instance.instance_id: e.in_flight for e in await self._endpoints()}
        return int(counts.get(instance_id, 0))

    async def _endpoints(self) -> list[Any]:
        async with grpc.aio.insecure_channel(self.scheduler) as ch:
            stub: Any = scheduler_pb2_grpc.SchedulerServiceStub(ch)
            resp = await stub.ListEndpoints(scheduler_pb2.ListEndpointsRequest(), timeout=5)
        return list(resp.endpoints)


def gateway_settings(
    redis_url: str, state_dir: Path, prefix: str, deployment: str, grpc_port: int, http_port: int
) -> SchedulerSettings:
    """A scheduler serving ``deployment`` from membership events alone (no static engines)."""
    return SchedulerSettings(
        grpc_port=grpc_port,
        http_port=http_port,
        metrics_port=0,
        deployment=deployment,
        redis_url=redis_url,
        stream_prefix=prefix,
        request_records=False,
        models=["tideserve-sim"],
        perf_profile="test",
        block_size=16,
        state_dir=state_dir / "scheduler",
        health_interval_s=0.5,
    )


@contextlib.asynccontextmanager
async def autoscaled_gateway(
    redis_url: str,
    state_dir: Path,
    *,
    engine_args: tuple[str, ...] = SIM_ARGS,
    drain_timeout_s: float = 30.0,
    stop_grace_s: float = 10.0,
    prefix: str = "",
    role: RoleTarget | None = None,
    **gateway: Any,
) -> AsyncIterator[Rig]:
    """The scheduler service and a started reconciler (no deployment applied yet); on exit
    the reconciler stops (its engines with it), then the scheduler. ``stop_grace_s``: SIGTERM
    to SIGKILL (a short one makes a removal without drain lose requests). ``role``: the
    worker role to scale (default: the simulator with ``engine_args``); ``gateway``: more
    scheduler settings."""
    prefix = prefix or f"t{uuid.uuid4().hex[:8]}"
    deployment = f"as-{uuid.uuid4().hex[:6]}"
    grpc_port, http_port = free_ports(2)
    first, last = port_range(61)
    settings = gateway_settings(redis_url, state_dir, prefix, deployment, grpc_port, http_port)
    settings = settings.model_copy(update=gateway)
    redis = aioredis.Redis.from_url(redis_url, decode_responses=False)
    scheduler = f"127.0.0.1:{grpc_port}"
    drv_settings = DriverSettings(kind="local", scheduler_addresses=[scheduler], resync_s=0.5,
                                  retry_base_s=0.2, drain_timeout_s=drain_timeout_s,
                                  drain_poll_s=0.05)  # fmt: skip
    drainer = RecordingDrainer([scheduler], timeout_s=drain_timeout_s, poll_s=0.05)
    local = LocalSettings(
        port_min=first, port_max=last, state_dir=str(state_dir / "engines"),
        probe_interval_s=0.05, stop_grace_s=stop_grace_s,
    )  # fmt: skip
    driver = LocalDriver(local, drainer)
    publisher = MembershipPublisher(StreamProducer(redis), prefix)
    reconciler = Reconciler(driver, drv_settings, publisher)
    try:
        async with scheduler_service(settings):
            await reconciler.start()
            try:
                yield Rig(
                    reconciler, driver, drainer, f"http://127.0.0.1:{http_port}", scheduler,
                    deployment, publisher.stream, redis, engine_args, prefix, role,
                )  # fmt: skip
            finally:
                await reconciler.stop()
    finally:
        await redis.aclose()


@dataclass
class ClosedLoop:
    """``clients`` loops, each sending one streamed chat request after another through
    ``gateway`` until :meth:`stop`; ``outcomes`` has every answer (in completion order)."""

    gateway: str
    clients: int
    max_tokens: int = 96
    model: str = "tideserve-sim"
    preamble: str = ""  # text before every request's own words
    outcomes: list[Outcome] = field(default_factory=list)
    sent: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._client(k)) for k in range(self.clients)]

    async def _client(self, k: int) -> None:
        url = self.gateway + "/v1/chat/completions"
        async with aiohttp.ClientSession() as http:
            n = 0
            while not self._stop.is_set():
                n += 1
                body = {
                    "model": self.model,
                    "messages": [
                        {"role": "user", "content": f"{self.preamble}client {k} request {n} hello"}
                    ],
                    "max_tokens": self.max_tokens,
                }
                self.sent += 1
                try:
                    out = await stream_sse(http, url, body)
                except (aiohttp.ClientError, TimeoutError) as e:
                    out = Outcome(status=-1, malformed=repr(e))
                self.outcomes.append(out)

    async def stop(self) -> None:
        """Let every request in flight finish, send no more."""
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != 200 or not o.done or o.error]


@contextlib.asynccontextmanager
async def autoscaler_service(settings: AutoscalerSettings) -> AsyncIterator[str]:
    """The autoscaler service as ``python -m services.autoscaler`` runs it (``main.build``
    with its real reconciler over ``settings.driver``, migrations as the runner does them),
    serving on ``settings.grpc_port`` until the block ends; yields its gRPC address. On
    exit the service stops, and with it the local driver's engines."""
    from services.common import db

    assert settings.postgres_url is not None
    await asyncio.to_thread(db.migrate, settings.postgres_url, "autoscaler")
    async with serving(settings, "autoscaler", build_autoscaler):
        yield f"127.0.0.1:{settings.grpc_port}"


async def tideserve(*argv: str) -> tuple[int, str, str]:
    """``tideserve ARGV`` as a process (the CLI is synchronous: it must not share the test's
    event loop with the services it calls); (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()
