"""Wires the fleet's outside feeds from settings (one object for ``main``):

- engine load snapshots on ``{prefix}:load:{deployment}`` (``load_stream`` and
  ``redis_url``; freshness bound ``load_stream_stale_s``), see :mod:`load_stream`;
- membership: the autoscaler's ``ListInstances`` seed (``autoscaler_address``) and
  ``{prefix}:membership`` (``membership_stream`` and ``redis_url``), see :mod:`membership`.

Construction does no I/O. :meth:`FleetFeeds.start` seeds and starts the readers (never
raises for an unreachable Redis or autoscaler: logged, counted, retried);
:meth:`FleetFeeds.stop` is idempotent. Their counters are exported through the gateway's
metrics as ``tideserve_gateway_feed_total{feed="load"|"membership", event}``.
"""

from __future__ import annotations

import grpc
import redis.asyncio as aioredis

from services.common.redis_client import redis_client
from services.common.security.channels import ClientSecurity, aio_channel
from services.common.streams import close_quietly
from services.scheduler.feeds.load_stream import LoadStream
from services.scheduler.feeds.membership import Membership
from services.scheduler.http.server import Gateway
from services.scheduler.settings import SchedulerSettings

__all__ = ["FleetFeeds"]


class FleetFeeds:
    def __init__(self, settings: SchedulerSettings, gateway: Gateway) -> None:
        fleet = gateway.core.fleet
        fleet.stream_stale_s = settings.load_stream_stale_s
        want_redis = settings.load_stream or settings.membership_stream
        self.redis: aioredis.Redis | None = None
        if settings.redis_url and want_redis:
            self.redis = redis_client(settings.redis_url, settings.redis_client)
        self.load: LoadStream | None = None
        if self.redis is not None and settings.load_stream:
            self.load = LoadStream(
                self.redis,
                fleet,
                deployment=settings.deployment,
                prefix=settings.stream_prefix,
                clock=gateway.clock,
                block_size=settings.block_size,
            )
            ls = self.load
            gateway.metrics.add_feed("load", lambda: ls.stats)
        self._channel: grpc.aio.Channel | None = None
        if settings.autoscaler_address:
            self._channel = aio_channel(settings.autoscaler_address, ClientSecurity.of(settings))
        self.membership: Membership | None = None
        follow = self.redis if settings.membership_stream else None
        if follow is not None or self._channel is not None:
            self.membership = Membership(
                fleet,
                deployment=settings.deployment,
                redis=follow,
                prefix=settings.stream_prefix,
                channel=self._channel,
                autoscaler=settings.autoscaler_address,
                deadline_s=settings.autoscaler_deadline_s,
            )
            m = self.membership
            gateway.metrics.add_feed("membership", lambda: m.stats)

    async def start(self) -> None:
        if self.membership is not None:
            await self.membership.start()
        if self.load is not None:
            self.load.start()

    async def stop(self) -> None:
        if self.load is not None:
            await self.load.stop()
        if self.membership is not None:
            await self.membership.stop()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
        await close_quietly(self.redis)
        self.redis = None
