"""``python -m services.telemetry``: the telemetry service process.

Composition root: one :class:`WindowMemory`, the Postgres :class:`RecordStore` and the
:class:`Ingest` path (when ``postgres_url`` is set), the ``{prefix}:requests`` consumer
(when ``redis_url`` is set too), a maintenance loop (partitions ahead, retention), the
Prometheus collector, the servicer, and the performance-model side: a
:class:`ModelService` (``model_enabled``) that observes newly committed records, follows the
engines' load and membership streams and answers GetPerfModel and GetRecommendation from
the same windows (:func:`window_source`), and the tool times learned from the same records
(:class:`ToolTimes`, ``GetToolTimes``). ``build``'s ``observers`` and ``model`` replace or
extend it (tests).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Mapping, Sequence

import grpc
import redis.asyncio as aioredis
from tideserve.v1 import events_pb2

from services.common.metrics import service_registry
from services.common.redis_client import redis_client
from services.common.server import ServiceHooks, run_service
from services.common.streams import DeadLetters, StreamConsumer, close_quietly, stream_name
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
from services.telemetry.tooltimes import ToolTimes
from services.telemetry.windows.bucket import RELATIVE_ACCURACY
from services.telemetry.windows.classes import SLOClass
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
    tool_times = ToolTimes()
    observers = [*observers, tool_times]
    store = _record_store(settings)
    ingest = _ingest(settings, store, memory, classes, replica_id, observers, wall)
    consumer = _consumer(settings, redis, ingest, replica_id)
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
    life = _Lifecycle(settings, wall, fitted, store, ingest, consumer, redis)

    def register(server: grpc.aio.Server) -> list[str]:
        query = WindowQuery(store, memory, classes, replica_id, wall)
        servicer = TelemetryServicer(
            query,
            ingest,
            model=model,
            tool_times=tool_times,
            dead=dead,
            report_batch=settings.ingest_batch,
            wall=wall,
        )
        return [add_to_server(servicer, server)]

    return ServiceHooks(
        register=register,
        on_start=life.start,
        on_stop=life.stop,
        registry=registry,
        access=(ACCESS,),
    )


def _record_store(settings: TelemetrySettings) -> RecordStore | None:
    """The Postgres record store (None without ``postgres_url``)."""
    if not settings.postgres_url:
        return None
    return RecordStore(
        settings.postgres_url,
        partition_ms=settings.partition_s * 1000,
        retention_ms=settings.retention_s * 1000,
        rollup_retention_ms=settings.rollup_retention_s * 1000,
        ahead=settings.partitions_ahead,
        accuracy=RELATIVE_ACCURACY,
    )


def _ingest(
    settings: TelemetrySettings,
    store: RecordStore | None,
    memory: WindowMemory,
    classes: Mapping[str, SLOClass],
    replica_id: str,
    observers: Sequence[RecordObserver],
    wall: Callable[[], float],
) -> Ingest | None:
    """The ingest path into ``store`` and ``memory`` (None without a store)."""
    if store is None:
        return None
    return Ingest(
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


def _consumer(
    settings: TelemetrySettings,
    redis: aioredis.Redis | None,
    ingest: Ingest | None,
    replica_id: str,
) -> StreamConsumer[events_pb2.RequestRecord] | None:
    """The ``{prefix}:requests`` consumer feeding ``ingest`` (None without Redis or ingest)."""
    if redis is None or ingest is None:
        return None
    return records_consumer(
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


class _Lifecycle:
    """Start and stop of the service's parts: the model side, the store's maintenance loop
    (partitions ahead, retention), the windows reloaded from the store, the consumer."""

    def __init__(
        self,
        settings: TelemetrySettings,
        wall: Callable[[], float],
        fitted: ModelService | None,
        store: RecordStore | None,
        ingest: Ingest | None,
        consumer: StreamConsumer[events_pb2.RequestRecord] | None,
        redis: aioredis.Redis | None,
    ) -> None:
        self._settings = settings
        self._wall = wall
        self._fitted = fitted
        self._store = store
        self._ingest = ingest
        self._consumer = consumer
        self._redis = redis
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _maintain(self, store: RecordStore) -> None:
        while not self._stop.is_set():
            try:
                done = await store.maintain(int(self._wall() * 1000))
                log.info("telemetry maintenance: %s", done)
            except Exception:
                log.exception("telemetry maintenance failed; retrying next interval")
            await pause(self._stop, self._settings.maintenance_interval_s)

    async def start(self) -> None:
        if self._fitted is not None:
            await self._fitted.start()
        if self._store is not None and self._ingest is not None:
            await self._store.maintain(int(self._wall() * 1000))
            await self._ingest.load()
            maintain = self._maintain(self._store)
            self._tasks.append(asyncio.create_task(maintain, name="telemetry-maintenance"))
        if self._consumer is not None:
            run = self._consumer.run(self._stop)
            self._tasks.append(asyncio.create_task(run, name="telemetry-ingest"))

    async def stop(self) -> None:
        self._stop.set()
        await stop_tasks(self._tasks, grace_s=self._settings.ingest_block_ms / 1000 + 2.0)
        if self._fitted is not None:
            await self._fitted.stop()
        if self._store is not None:
            await self._store.close()
        if self._redis is not None:
            await close_quietly(self._redis)


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 (one stderr line) if it cannot start."""
    return run_service(
        "telemetry",
        TelemetrySettings,
        build,
        argv,
        description="Tideserve telemetry: per-request records, windows, the performance model and recommendations.",
    )
