"""``python -m services.autoscaler``: the autoscaler service process.

Wiring: Postgres (required for deployments; migrated by the runner) holds specs, revisions
and decisions; the planner loop reads the ``TelemetryService`` at ``telemetry_address`` and
hands decisions to a :class:`~services.common.planner.ports.Reconciler`: by default the drivers'
reconciler over ``settings.driver`` (with ``driver.kvmeta_address``, kvmeta's session KV per
instance weighs scale-in victims and a drained instance's sessions are migrated) (:class:`~services.autoscaler.seam.DriverReconciler`,
started and stopped with the service; stopping the local driver stops its engines),
publishing membership on ``{stream_prefix}:membership`` when ``redis_url`` is set. Tests
pass their own ``reconciler_factory`` (a fake, nothing started).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

import grpc

from services.autoscaler.access import ACCESS
from services.autoscaler.deployments import Deployments
from services.autoscaler.drivers.build import build_reconciler
from services.autoscaler.drivers.sessions import KVMetaSessions
from services.autoscaler.loop import LoopOptions, PlannerLoop
from services.autoscaler.metrics import AutoscalerMetrics
from services.autoscaler.scope import Scope
from services.autoscaler.seam import DriverReconciler, LoadPoller, SessionKVPoller
from services.autoscaler.servicer import AutoscalerServicer, add_to_server
from services.autoscaler.settings import AutoscalerSettings
from services.autoscaler.store import AutoscalerStore
from services.autoscaler.telemetry import GrpcTelemetry
from services.common.metrics import service_registry
from services.common.planner.ports import Reconciler
from services.common.redis_client import redis_client
from services.common.security.channels import ClientSecurity, aio_channel
from services.common.server import ServiceHooks, run_service
from services.common.tasks import stop_tasks

__all__ = ["build", "main"]

log = logging.getLogger(__name__)


def _wall_ms() -> int:
    return int(time.time() * 1000)


def build(
    settings: AutoscalerSettings,
    reconciler_factory: Callable[[AutoscalerSettings], Reconciler] | None = None,
) -> ServiceHooks:
    """Wire store, planner loop, reconciler and servicer from ``settings``."""
    from services.common import db

    registry = service_registry()
    metrics = AutoscalerMetrics(registry)
    security = ClientSecurity.of(settings)
    if settings.postgres_url is None:

        def register_only(server: grpc.aio.Server) -> list[str]:
            return [add_to_server(AutoscalerServicer(None, _wall_ms), server)]

        return ServiceHooks(register=register_only, registry=registry, access=(ACCESS,))

    scope = Scope(tuple(settings.managed_deployments))
    engine = db.create_engine(settings.postgres_url, "autoscaler")
    store = AutoscalerStore(engine)
    redis = (
        redis_client(settings.redis_url, settings.redis_client)
        if settings.redis_url and reconciler_factory is None
        else None
    )
    driven: DriverReconciler | None = None
    kvmeta: KVMetaSessions | None = None
    if reconciler_factory is None:
        if settings.driver.kvmeta_address:
            kvmeta = KVMetaSessions(aio_channel(settings.driver.kvmeta_address, security))
        rec = build_reconciler(
            settings.driver,
            redis,
            settings.stream_prefix,
            lambda address: aio_channel(address, security),
            kvmeta,
        )
        driven = DriverReconciler(
            rec,
            LoadPoller(rec, settings.load_poll_s, timeout_s=min(1.0, settings.load_poll_s)),
            scope,
            SessionKVPoller(rec, kvmeta, settings.session_kv_poll_s) if kvmeta else None,
        )
        reconciler: Reconciler = driven
    else:
        reconciler = reconciler_factory(settings)
    channel = aio_channel(settings.telemetry_address, security)
    loop = PlannerLoop(
        store,
        reconciler,
        GrpcTelemetry(channel, settings.telemetry_timeout_s),
        settings.planner,
        LoopOptions(settings.advisory, settings.budget_groups, settings.hold_record_s, scope),
        metrics,
        clock=time.monotonic,
        wall=time.time,
    )
    deployments = Deployments(
        store, reconciler, loop, advisory=settings.advisory, wall=time.time, scope=scope
    )
    stopping = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def on_start() -> None:
        if driven is not None:
            await driven.start()
            try:  # the reconciler starts empty: every stored deployment back to desired
                await deployments.resume()
            except Exception:  # Postgres away: the planner's first tick hands targets over
                log.exception("could not resume the stored deployments")
        if settings.planner_enabled:
            tasks.append(asyncio.create_task(loop.run(stopping), name="planner-loop"))

    async def on_stop() -> None:
        stopping.set()
        await stop_tasks(tasks)
        if driven is not None:
            await driven.stop()
        if kvmeta is not None:
            await kvmeta.close()
        if redis is not None:
            await redis.aclose()
        await channel.close()
        await engine.dispose()

    def register(server: grpc.aio.Server) -> list[str]:
        return [add_to_server(AutoscalerServicer(deployments, _wall_ms), server)]

    return ServiceHooks(
        register=register, on_start=on_start, on_stop=on_stop, registry=registry, access=(ACCESS,)
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 (one stderr line) if it cannot start."""
    return run_service(
        "autoscaler",
        AutoscalerSettings,
        build,
        argv,
        description="Tideserve autoscaler: deployments, instances and scaling decisions.",
    )
