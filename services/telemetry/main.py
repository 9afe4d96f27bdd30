"""``python -m services.telemetry``: the telemetry service process.

Composition root: one :class:`WindowMemory`, the Postgres :class:`RecordStore` and the
:class:`Ingest` path (when ``postgres_url`` is set), the ``{prefix}:requests`` consumer
(when ``redis_url`` is set too), a maintenance loop (partitions ahead, retention), the
Prometheus collector, the servicer, and the performance-model side: a
:class:`ModelService` (``model_enabled``) that observes newly committed records, follows the
engines' load and membership streams and answers GetPerfModel and GetRecommendation from
the same windows (:func:`window_source`). ``build``'s ``observers`` and ``model`` replace or
extend it (tests).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Sequence

import grpc

from services.common.metrics import service_registry
from services.common.redis_client import redis_client
from services.common.server import ServiceHooks, run_service
from services.common.streams import DeadLetters, close_quietly, stream_name
from services.common.tasks import pause, stop_tasks
from services.telemetry.access import ACCESS
from services.telemetry.ingest.pipeline import Ingest, IngestCounts
from services.telemetry.ingest.stream import records_consumer
from services.telemetry.metrics import TelemetryCollector
from services.telemetry.model.service import ModelService
from services.telemetry.ports import ModelRpc, RecordObserver
from services.telemetry.query import WindowQuery
from services.telemetry.servicer import TelemetryServicer, add_to_server
from services.telemetry.settings import TelemetrySettings
from services.telemetry.source import MemoryWindowSource
from services.telemetry.store.pg import RecordStore
from services.telemetry.windows.bucket import RELATIVE_ACCURACY
from services.telemetry.windows.memory import WindowMemory
from services.telemetry.windows.validate import ValidationRules

__all__ = ["build", "main", "window_source"]

log = logging.getLogger(__name__)


def new_memory(settings: TelemetrySettings) -> WindowMemory:
    return WindowMemory(settings.bucket_s * 1000, max(settings.memory_s, settings.bucket_s) * 1000)


def window_source(settings: TelemetrySettings, memory: WindowMemory) -> MemoryWindowSource:
    """The :class:`~services.telemetry.ports.WindowSource` the model side is handed."""
    return MemoryWindowSource(memory, settings.classes())


def build(
    settings: TelemetrySettings,
    observers: Sequence[RecordObserver] = (),
    model: ModelRpc | None = None,
    *,
    memory: WindowMemory | None = None,
    wall: Callable[[], float] = time.time,
) -> ServiceHooks:
    """Wire the telemetry service from ``settings``. Pass ``memory`` to share the windows
    with the model side (``window_source(settings, memory)``)."""
    replica_id = settings.replica_id or socket.gethostname()
    memory = memory if memory is not None else new_memory(settings)
    classes = settings.classes()
    redis = redis_client(settings.redis_url, settings.redis_client) if settings.redis_url else None
    fitted: ModelService | None = None
    if model is None and settings.model_enabled:
        fitted = ModelService(
            settings.model,
            windows=window_source(settings, memory),
            redis=redis,
            prefix=settings.stream_prefix,
            wall=wall,
        )
        model = fitted
        observers = [*observers, fitted]
    store = (
        RecordStore(
            settings.postgres_url,
            partition_ms=settings.partition_s * 1000,
            retention_ms=settings.retention_s * 1000,
            rollup_retention_ms=settings.rollup_retention_s * 1000,
            ahead=settings.partitions_ahead,
            accuracy=RELATIVE_ACCURACY,
        )
        if settings.postgres_url
        else None
    )
    ingest = (
        Ingest(
            store,
            memory,
            rules=ValidationRules.of(
                settings.deployments,
                int(settings.max_skew_s * 1000),
                settings.retention_s * 1000,
            ),
            classes=classes,
            replica_id=replica_id,
            observers=observers,
            wall=wall,
        )
        if store is not None
        else None
    )
    consumer = (
        records_consumer(
            redis,
            ingest,
            prefix=settings.stream_prefix,
            group=settings.ingest_group,
            consumer=replica_id,
            batch=settings.ingest_batch,
            block_ms=settings.ingest_block_ms,
            claim_idle_ms=settings.ingest_claim_idle_ms,
            max_attempts=settings.stream_max_attempts,
        )
        if redis is not None and ingest is not None
        else None
    )
    dead = (
        DeadLetters(redis, stream_name(settings.stream_prefix, "requests"), "rpc")
        if redis is not None
        else None
    )
    registry = service_registry()
    registry.register(
        TelemetryCollector(
            memory,
            classes,
            ingest.counts if ingest is not None else IngestCounts(),
            (lambda: consumer.stats.dead) if consumer is not None else (lambda: 0),
            settings.gauge_window_s,
            wall,
        )
    )
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def maintain() -> None:
        assert store is not None
        while not stop.is_set():
            try:
                done = await store.maintain(int(wall() * 1000))
                log.info("telemetry maintenance: %s", done)
            except Exception:
                log.exception("telemetry maintenance failed; retrying next interval")
            await pause(stop, settings.maintenance_interval_s)

    async def on_start() -> None:
        if fitted is not None:
            await fitted.start()
        if store is not None and ingest is not None:
            await store.maintain(int(wall() * 1000))
            await ingest.load()
            tasks.append(asyncio.create_task(maintain(), name="telemetry-maintenance"))
        if consumer is not None:
            tasks.append(asyncio.create_task(consumer.run(stop), name="telemetry-ingest"))

    async def on_stop() -> None:
        stop.set()
        await stop_tasks(tasks, grace_s=settings.ingest_block_ms / 1000 + 2.0)
        if fitted is not None:
            await fitted.stop()
        if store is not None:
            await store.close()
        if redis is not None:
            await close_quietly(redis)

    def register(server: grpc.aio.Server) -> list[str]:
        query = WindowQuery(store, memory, classes, replica_id, wall)
        servicer = TelemetryServicer(
            query, ingest, model=model, dead=dead, report_batch=settings.ingest_batch, wall=wall
        )
        return [add_to_server(servicer, server)]

    return ServiceHooks(
        register=register, on_start=on_start, on_stop=on_stop, registry=registry, access=(ACCESS,)
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 (one stderr line) if it cannot start."""
    return run_service(
        "telemetry",
        TelemetrySettings,
        build,
        argv,
        description="Tideserve telemetry: per-request records, windows, the performance model and recommendations.",
    )
