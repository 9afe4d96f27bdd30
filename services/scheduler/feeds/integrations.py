"""Wires the gateway's optional integrations from settings (one object for ``main``):

- request records on ``{prefix}:requests`` (``request_records`` and ``redis_url``),
- active-active state sharing (``share_state`` and ``redis_url``),
- precise prefix data (when a profile uses it), from ``precise_source``: ``kvmeta``
  (``MatchPrefix`` per request to ``kvmeta_address``), ``local`` (a replica of the KV index
  in this process fed from ``{prefix}:kv:{deployment}``, see :mod:`kv_replica`; needs
  ``redis_url``) or ``off``. Either way ``lookup`` is the ``prefix_lookup`` hook the HTTP
  gateway and the gRPC servicer share;
- agent-session turns to kvmeta (``agent_sessions`` and ``kvmeta_address``; see
  :mod:`session_feed`), a ``picked`` and a ``finished`` listener of the gateway.

``Integrations(settings, core, gateway)`` builds everything without I/O (with records on,
it adds the record builder to the gateway's ``finished`` listeners); ``start()``/``stop()`` run and end the background tasks and connections (``stop`` is
idempotent and never raises for a dead Redis or kvmeta). While started, their counters are
exported to Prometheus: ``tideserve_gateway_records_total{event}``,
``tideserve_gateway_shared_total{event}``, ``tideserve_gateway_kvmeta_lookups_total{result}``,
``tideserve_gateway_kv_replica_total{event}`` and ``tideserve_gateway_sessions_total{event}``.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid

import grpc
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from services.common.errors import StartupError
from services.common.redis_client import redis_client
from services.common.scheduling.service import GatewayCore
from services.common.security.channels import ClientSecurity, aio_channel
from services.common.streams import close_quietly
from services.scheduler.feeds.kv_replica import KVReplicaFeed, LocalLookup
from services.scheduler.feeds.kv_replica_core import KVReplica
from services.scheduler.feeds.kvmeta_client import KVMetaLookup, precise_profiles
from services.scheduler.feeds.record_sink import RecordSink, make_sink
from services.scheduler.feeds.session_feed import SessionFeed
from services.scheduler.feeds.shared import SharedState
from services.scheduler.http.records import record_requests
from services.scheduler.http.server import Gateway
from services.scheduler.settings import SchedulerSettings

__all__ = ["Integrations", "default_replica_id"]

log = logging.getLogger(__name__)


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Integrations:
    """Raises :class:`StartupError` for settings that cannot work together (e.g.
    ``share_state`` without ``redis_url``, a heartbeat TTL not above its period). Its
    metrics go to ``registry`` (default: the gateway's, which is the service's)."""

    def __init__(
        self,
        settings: SchedulerSettings,
        core: GatewayCore,
        gateway: Gateway,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if settings.share_state and not settings.redis_url:
            raise StartupError("share_state: needs redis_url (replicas share state through Redis)")
        if settings.precise_source == "local" and not settings.redis_url:
            raise StartupError("precise_source=local: needs redis_url (KV events come from Redis)")
        if settings.agent_sessions and not settings.kvmeta_address:
            raise StartupError("agent_sessions: needs kvmeta_address (kvmeta holds the sessions)")
        if settings.share_heartbeat_ttl_s <= settings.share_heartbeat_s:
            raise StartupError(
                f"share_heartbeat_ttl_s: must exceed share_heartbeat_s "
                f"({settings.share_heartbeat_ttl_s} <= {settings.share_heartbeat_s})"
            )
        self.settings = settings
        self.registry = registry if registry is not None else gateway.metrics.registry
        self._collector: _Collector | None = None
        self.replica_id = settings.replica_id or default_replica_id()
        self.redis: aioredis.Redis | None = None
        self.sink: RecordSink | None = None
        self.shared: SharedState | None = None
        self.lookup: KVMetaLookup | LocalLookup | None = None
        self.kv_feed: KVReplicaFeed | None = None
        self._kv_redis: aioredis.Redis | None = None
        self._channel: grpc.aio.Channel | None = None
        self.sessions: SessionFeed | None = None
        if settings.redis_url and (settings.request_records or settings.share_state):
            self.redis = redis_client(settings.redis_url, settings.redis_client)
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
                dispatch=gateway.dispatch,
            )
        profiles = precise_profiles(core.scheduler)
        source = settings.precise_source
        if settings.kvmeta_address and not profiles:
            log.warning("kvmeta_address is set but no scheduler profile uses precise-prefix")
        wanted = profiles if not gateway.opts.profile else _resolve(profiles, gateway)
        if source == "local" and profiles and settings.redis_url:
            self._kv_redis = redis_client(settings.redis_url, settings.redis_client)
            replica = KVReplica()
            self.kv_feed = KVReplicaFeed(
                self._kv_redis,
                replica,
                deployment=settings.deployment,
                prefix=settings.stream_prefix,
                clock=gateway.clock,
                candidates=core.fleet.ids,
            )
            self.lookup = LocalLookup(replica, deployment=settings.deployment, profiles=wanted)
            gateway.prefix_lookup = self.lookup
        elif source == "kvmeta" and settings.kvmeta_address and profiles:
            self._channel = aio_channel(
                settings.kvmeta_address, ClientSecurity.of(settings), gateway.tracer_provider
            )
            self.lookup = KVMetaLookup(
                self._channel,
                candidates=core.fleet.ids,
                profiles=wanted,
                deadline_s=settings.kvmeta_deadline_ms / 1000.0,
            )
            gateway.prefix_lookup = self.lookup
        self.gateway = gateway
        if settings.agent_sessions:
            self._wire_sessions(settings, gateway)
        if self.sink is not None:
            gateway.finished.append(
                record_requests(
                    self.sink, deployment=settings.deployment, replica_id=self.replica_id
                )
            )

    def _wire_sessions(self, settings: SchedulerSettings, gateway: Gateway) -> None:
        if self._channel is None:
            self._channel = aio_channel(
                settings.kvmeta_address, ClientSecurity.of(settings), gateway.tracer_provider
            )
        self.sessions = SessionFeed(
            self._channel,
            deployment=settings.deployment,
            buffer=settings.agent_sessions_buffer,
            deadline_s=settings.agent_sessions_deadline_ms / 1000.0,
            clock=gateway.clock,
        )
        gateway.picked.append(self.sessions.picked)
        gateway.finished.append(self.sessions.finished)

    async def start(self) -> None:
        if self._collector is None:
            self._collector = _Collector(self)
            self.registry.register(self._collector)
        if self.sink is not None:
            self.sink.start()
        if self.shared is not None:
            await self.shared.start()
        if self.kv_feed is not None:
            self.kv_feed.start()
        if self.sessions is not None:
            self.sessions.start()
        if self._channel is not None:
            # Start connecting now, without waiting: the first lookups would otherwise spend
            # their short deadline on the TCP/HTTP2 handshake and route without precise data.
            self._channel.get_state(try_to_connect=True)

    async def stop(self) -> None:
        if self._collector is not None:
            self.registry.unregister(self._collector)
            self._collector = None
        if self.shared is not None:
            await self.shared.stop()
        if self.kv_feed is not None:
            await self.kv_feed.stop()
        await close_quietly(self._kv_redis)
        self._kv_redis = None
        if self.sink is not None:
            await self.sink.stop()
        if self.sessions is not None:
            await self.sessions.stop()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        await close_quietly(self.redis)
        self.redis = None


def _resolve(profiles: frozenset[str], gateway: Gateway) -> frozenset[str]:
    """With a gateway-wide default profile, requests naming none ("") run that one."""
    out = set(profiles) - {""}
    if gateway.opts.profile in profiles:
        out.add("")
    return frozenset(out)


class _Collector(Collector):
    """Exports the integrations' counters at scrape time (nothing on the request path)."""

    def __init__(self, owner: Integrations) -> None:
        self.owner = owner

    def collect(self) -> list[CounterMetricFamily]:
        o = self.owner
        out = []
        for name, doc, label, stats in (
            ("tideserve_gateway_records", "Request records by event", "event", o.sink),
            ("tideserve_gateway_shared", "Active-active sharing by event", "event", o.shared),
            (
                "tideserve_gateway_kvmeta_lookups",
                "MatchPrefix lookups by result",
                "result",
                o.lookup if isinstance(o.lookup, KVMetaLookup) else None,
            ),
            (
                "tideserve_gateway_kv_replica",
                "Local KV index replica: stream batches and lookups by event",
                "event",
                _ReplicaStats(o.kv_feed, o.lookup) if o.kv_feed is not None else None,
            ),
            ("tideserve_gateway_sessions", "Session turns to kvmeta by event", "event", o.sessions),
        ):
            if stats is None:
                continue
            fam = CounterMetricFamily(name, doc, labels=[label])
            for key, value in sorted(stats.stats.items()):
                fam.add_metric([key], float(value))
            out.append(fam)
        return out


class _ReplicaStats:
    """The replica feed's and local lookups' counters as one ``stats`` mapping."""

    def __init__(self, feed: KVReplicaFeed, lookup: object) -> None:
        self.stats = dict(feed.stats)
        if isinstance(lookup, LocalLookup):
            self.stats.update({f"lookup_{k}": v for k, v in lookup.stats.items()})
