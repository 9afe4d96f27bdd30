"""``python -m services.autoscaler``: the autoscaler service process.

Wiring: Postgres (required for deployments; migrated by the runner) holds specs, revisions
and decisions; the planner loop reads the ``TelemetryService`` at ``telemetry_address`` and
hands decisions to a :class:`~services.autoscaler.ports.Reconciler`. ``build`` takes the
reconciler factory; the default is :class:`UnwiredReconciler` until the drivers land.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import grpc

from services.autoscaler.deployments import Deployments
from services.autoscaler.loop import LoopOptions, PlannerLoop
from services.autoscaler.metrics import AutoscalerMetrics
from services.autoscaler.ports import Reconciler, UnwiredReconciler
from services.autoscaler.servicer import AutoscalerServicer, add_to_server
from services.autoscaler.settings import AutoscalerSettings
from services.autoscaler.store import AutoscalerStore
from services.autoscaler.telemetry import GrpcTelemetry
from services.common.metrics import service_registry
from services.common.server import ServiceHooks, run_service
from services.common.tasks import stop_tasks

__all__ = ["build", "main"]


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
    if settings.postgres_url is None:

        def register_only(server: grpc.aio.Server) -> list[str]:
            return [add_to_server(AutoscalerServicer(None, _wall_ms), server)]

        return ServiceHooks(register=register_only, registry=registry)

    engine = db.create_engine(settings.postgres_url, "autoscaler")
    store = AutoscalerStore(engine)
    reconciler = (reconciler_factory or (lambda _s: UnwiredReconciler()))(settings)
    channel = grpc.aio.insecure_channel(settings.telemetry_address)
    loop = PlannerLoop(
        store,
        reconciler,
        GrpcTelemetry(channel, settings.telemetry_timeout_s),
        settings.planner,
        LoopOptions(settings.advisory, settings.budget_groups, settings.hold_record_s),
        metrics,
        clock=time.monotonic,
        wall=time.time,
    )
    deployments = Deployments(store, reconciler, loop, advisory=settings.advisory, wall=time.time)
    stopping = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def on_start() -> None:
        if settings.planner_enabled:
            tasks.append(asyncio.create_task(loop.run(stopping), name="planner-loop"))

    async def on_stop() -> None:
        stopping.set()
        await stop_tasks(tasks)
        await channel.close()
        await engine.dispose()

    def register(server: grpc.aio.Server) -> list[str]:
        return [add_to_server(AutoscalerServicer(deployments, _wall_ms), server)]

    return ServiceHooks(register=register, on_start=on_start, on_stop=on_stop, registry=registry)


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 (one stderr line) if it cannot start."""
    return run_service(
        "autoscaler",
        AutoscalerSettings,
        build,
        argv,
        description="Tideserve autoscaler: deployments, instances and scaling decisions.",
    )
