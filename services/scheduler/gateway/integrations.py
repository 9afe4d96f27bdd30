"""Wires the gateway's optional integrations from settings (one object for ``main``):

- request records on ``{prefix}:requests`` (``request_records`` and ``redis_url``),
- active-active state sharing (``share_state`` and ``redis_url``),
- precise prefix data from kvmeta (``kvmeta_address``, when a profile uses it).

``Integrations(settings, core, gateway)`` builds everything without I/O; ``install(app)``
adds the records middleware to the gateway's aiohttp app (before it starts);
``start()``/``stop()`` run and end the background tasks and connections (``stop`` is
idempotent and never raises for a dead Redis or kvmeta).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid

import grpc
import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import RedisError

from services.common.otel import insecure_channel
from services.scheduler.gateway.core import GatewayCore
from services.scheduler.gateway.kvmeta_client import KVMetaLookup, precise_profiles
from services.scheduler.gateway.records import RecordSink, make_sink, record_requests
from services.scheduler.gateway.server import Gateway
from services.scheduler.gateway.shared import SharedState
from services.scheduler.settings import SchedulerSettings

__all__ = ["Integrations", "default_replica_id"]


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Integrations:
    def __init__(self, settings: SchedulerSettings, core: GatewayCore, gateway: Gateway) -> None:
        self.settings = settings
        self.replica_id = settings.replica_id or default_replica_id()
        self.redis: aioredis.Redis | None = None
        self.sink: RecordSink | None = None
        self.shared: SharedState | None = None
        self.lookup: KVMetaLookup | None = None
        self._channel: grpc.aio.Channel | None = None
        if settings.redis_url and (settings.request_records or settings.share_state):
            self.redis = aioredis.Redis.from_url(settings.redis_url, decode_responses=False)
        if self.redis is not None and settings.request_records:
            self.sink = make_sink(self.redis, settings.stream_prefix)
        if self.redis is not None and settings.share_state:
            self.shared = SharedState(
                self.redis,
                core,
                deployment=settings.deployment,
                replica_id=self.replica_id,
                prefix=settings.stream_prefix,
                clock=gateway.clock,
                heartbeat_s=settings.share_heartbeat_s,
                heartbeat_ttl_s=settings.share_heartbeat_ttl_s,
            )
        profiles = precise_profiles(core.scheduler)
        if settings.kvmeta_address and profiles:
            self._channel = insecure_channel(settings.kvmeta_address)
            self.lookup = KVMetaLookup(
                self._channel,
                candidates=core.fleet.ids,
                profiles=profiles if not gateway.opts.profile else _resolve(profiles, gateway),
                deadline_s=settings.kvmeta_deadline_ms / 1000.0,
            )
            gateway.prefix_lookup = self.lookup
        self.gateway = gateway

    def install(self, app: web.Application) -> None:
        """Add the request-records middleware (call before the app starts)."""
        if self.sink is not None:
            app.middlewares.append(
                record_requests(
                    self.sink,
                    deployment=self.settings.deployment,
                    clock=self.gateway.clock,
                    wall=time.time,
                )
            )

    async def start(self) -> None:
        if self.sink is not None:
            self.sink.start()
        if self.shared is not None:
            await self.shared.start()

    async def stop(self) -> None:
        if self.shared is not None:
            await self.shared.stop()
        if self.sink is not None:
            await self.sink.stop()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        if self.redis is not None:
            with contextlib.suppress(RedisError, OSError):
                await self.redis.aclose()
            self.redis = None


def _resolve(profiles: frozenset[str], gateway: Gateway) -> frozenset[str]:
    """With a gateway-wide default profile, requests naming none ("") run that one."""
    out = set(profiles) - {""}
    if gateway.opts.profile in profiles:
        out.add("")
    return frozenset(out)
