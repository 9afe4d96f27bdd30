"""``python -m services.kvmeta``: the kvmeta service process.

Wiring: Redis (optional) feeds the prefix index from ``{prefix}:kv:*`` streams; Postgres
(optional) stores index checkpoints, object-master rows and agent sessions (migrated at
start); the
Mooncake Transfer Engine HTTP metadata server runs on ``metadata_http_port`` (0 = off);
with ``telemetry_address``, telemetry's tool times are the session predictor's priors
(:mod:`services.kvmeta.tool_priors`, over a channel with kvmeta's client credentials).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

import grpc

from services.common.kvindex import ResyncPolicy
from services.common.metrics import service_registry
from services.common.redis_client import redis_client
from services.common.security.channels import ClientSecurity, aio_channel
from services.common.security.http import http_auth
from services.common.server import ServiceHooks, run_service
from services.common.sessions import SessionTable, ToolTimePredictor
from services.kvmeta.access import ACCESS, METADATA_ACCESS
from services.kvmeta.checkpoint import KVMetaStore
from services.kvmeta.engine_urls import EngineUrls
from services.kvmeta.fetchable import on_gpu_and_tier
from services.kvmeta.index import PrefixIndex
from services.kvmeta.ingest import IndexFeeder
from services.kvmeta.metadata_http import MetadataServer
from services.kvmeta.metrics import KVMetaCollector
from services.kvmeta.migrate import SessionMigrator
from services.kvmeta.objects import ObjectMaster
from services.kvmeta.rebalance import Rebalancer
from services.kvmeta.retention import RetentionController
from services.kvmeta.servicer import KVMetaServicer, ObjectShell, add_to_server
from services.kvmeta.sessions import SessionShell, SessionStore
from services.kvmeta.settings import KVMetaSettings
from services.kvmeta.tool_priors import GrpcToolTimes, ToolTimePriors

__all__ = ["build", "main"]

log = logging.getLogger(__name__)


def build(settings: KVMetaSettings) -> ServiceHooks:
    """Wire cores, stores, consumers and servicer from ``settings``."""
    from services.common import db

    redis = redis_client(settings.redis_url, settings.redis_client) if settings.redis_url else None
    engine = db.create_engine(settings.postgres_url, "kvmeta") if settings.postgres_url else None
    store = KVMetaStore(engine) if engine is not None else None
    engine_urls = EngineUrls(settings.retention_engine_urls)
    feeder = IndexFeeder(
        PrefixIndex(),
        time.time,
        redis=redis,
        store=store,
        prefix=settings.stream_prefix,
        consumer=settings.consumer_name,
        max_attempts=settings.stream_max_attempts,
        checkpoint_interval_s=settings.checkpoint_interval_s,
        expire_after_s=settings.instance_expiry_s,
        resync_policy=ResyncPolicy(
            settings.resync_retry_s, max(settings.resync_retry_s, settings.resync_max_retry_s)
        ),
        resync_check_s=settings.resync_check_s,
        engine_urls=engine_urls,
    )
    objects = ObjectShell(
        ObjectMaster(
            lease_s=settings.lease_s,
            put_timeout_s=settings.put_timeout_s,
            high_watermark=settings.high_watermark,
            low_watermark=settings.low_watermark,
            quotas=settings.tenant_quotas,
        ),
        store,
        time.time,
    )
    sessions = _sessions(settings, SessionStore(engine) if engine is not None else None)
    priors = _tool_priors(settings, sessions.table.predictor)
    metadata = MetadataServer(
        settings.host,
        settings.metadata_http_port,
        middlewares=[]
        if settings.metadata_http_open
        else http_auth(settings.auth, METADATA_ACCESS, time.monotonic),
    )
    tasks: list[asyncio.Task[None]] = []
    stopping = asyncio.Event()

    async def tick_objects() -> None:
        while True:
            await asyncio.sleep(settings.object_tick_s)
            try:
                await objects.tick()
            except Exception:  # keep ticking; the next tick persists what is pending
                log.exception("object master tick failed")

    retention = (
        RetentionController(
            sessions,
            mode=settings.retention,
            budget_share=settings.retention_budget_share,
            keep_unprotected=settings.retention_offload == "pressure",
            urls=engine_urls,
            prefetch=settings.retention_prefetch,
            tick_s=settings.retention_tick_s,
            prefetch_margin_ratio=settings.prefetch_margin_ratio,
            prefetch_margin_s=settings.prefetch_margin_s,
            rebalance=Rebalancer(window_s=settings.migration_active_window_s)
            if settings.retention_rebalance
            else None,
            locate=lambda s, chain: on_gpu_and_tier(
                feeder.index, objects.master.exist, s.deployment, s.tenant, s.home_instance, chain
            ),
        )
        if settings.retention != "off"
        else None
    )

    registry = service_registry()
    registry.register(
        KVMetaCollector(
            feeder, objects.master, retention=retention.stats if retention is not None else None
        )
    )

    migrator = SessionMigrator(
        sessions,
        urls=engine_urls,
        offload_wait_s=settings.migration_offload_wait_s,
        placement=settings.migration_placement,
        active_window_s=settings.migration_active_window_s,
        prefetch=settings.migration_prefetch,
    )

    async def tick_retention() -> None:
        assert retention is not None
        while True:
            await asyncio.sleep(settings.retention_tick_s)
            try:
                await retention.tick()
            except Exception:  # keep ticking: one engine or one tick must not stop it
                log.exception("retention tick failed")

    async def tick_sessions() -> None:
        while True:
            await asyncio.sleep(settings.session_tick_s)
            try:
                await sessions.tick()
            except Exception:  # keep ticking; the next tick persists what is pending
                log.exception("session expiry tick failed")

    async def on_start() -> None:
        # the runner already migrated the kvmeta schema (services.common.server)
        await objects.load()
        await sessions.load()
        await feeder.start()
        import gc

        gc.collect()
        gc.freeze()  # the loaded index is long-lived: keep it out of GC scans
        tasks.append(asyncio.create_task(tick_objects()))
        tasks.append(asyncio.create_task(tick_sessions()))
        if retention is not None:
            tasks.append(asyncio.create_task(tick_retention()))
        if priors is not None:
            tasks.append(asyncio.create_task(priors[0].run(stopping), name="tool-priors"))
        if settings.metadata_http_port:
            await metadata.start()

    async def on_stop() -> None:
        stopping.set()
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await metadata.stop()
        if priors is not None:
            await priors[1].close()
        if retention is not None:
            await retention.close()
        await feeder.stop()
        with contextlib.suppress(Exception):
            await objects.persist()
        with contextlib.suppress(Exception):
            await sessions.persist()
        if redis is not None:
            await redis.aclose()
        if engine is not None:
            await engine.dispose()

    def register(server: grpc.aio.Server) -> list[str]:
        servicer = KVMetaServicer(
            feeder,
            objects,
            max_match_blocks=settings.max_match_blocks,
            sessions=sessions,
            migrator=migrator,
        )
        return [add_to_server(servicer, server)]

    return ServiceHooks(
        register=register, on_start=on_start, on_stop=on_stop, registry=registry, access=(ACCESS,)
    )


def _sessions(
    settings: KVMetaSettings,
    store: SessionStore | None,
    wall: Callable[[], float] = time.time,
) -> SessionShell:
    predictor = ToolTimePredictor(
        min_samples=settings.tool_time_min_samples,
        session_min_samples=settings.session_min_samples,
        default_gap_s=settings.session_default_gap_s,
    )
    table = SessionTable(
        predictor,
        percentile=settings.session_percentile,
        idle_timeout_s=settings.session_idle_timeout_s,
        ended_retention_s=settings.session_ended_retention_s,
        max_sessions=settings.max_sessions,
    )
    return SessionShell(table, store, wall, max_chain_blocks=settings.retention_max_chain_blocks)


def _tool_priors(
    settings: KVMetaSettings, predictor: ToolTimePredictor
) -> tuple[ToolTimePriors, GrpcToolTimes] | None:
    """Telemetry's tool times as ``predictor``'s priors; None without ``telemetry_address``."""
    if not settings.telemetry_address:
        return None
    channel = aio_channel(settings.telemetry_address, ClientSecurity.of(settings))
    source = GrpcToolTimes(channel, settings.telemetry_timeout_s)
    priors = ToolTimePriors(
        predictor,
        source,
        deployment=settings.tool_times_deployment,
        refresh_s=settings.tool_times_refresh_s,
        clock=time.monotonic,
    )
    return priors, source


def main(argv: Sequence[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop, 2 (one stderr line) if it cannot start."""
    return run_service(
        "kvmeta",
        KVMetaSettings,
        build,
        argv,
        description="Tideserve kvmeta: the global KV-block index, agent sessions, tier/object metadata and the data-plane segment registry.",
    )
