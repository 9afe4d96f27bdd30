"""One call for the service's wiring: the driver ``DriverSettings.kind`` names, and a
reconciler over it publishing membership on ``{prefix}:membership``."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import redis.asyncio as aioredis

from services.autoscaler.drivers.drain import Drainer
from services.autoscaler.drivers.dryrun import DryRunDriver
from services.autoscaler.drivers.kubernetes import KubernetesDriver
from services.autoscaler.drivers.local import LocalDriver
from services.autoscaler.drivers.sessions import KVMetaSessions
from services.autoscaler.drivers.settings import DriverSettings
from services.autoscaler.membership import MembershipPublisher
from services.autoscaler.reconciler import Reconciler
from services.common.planner.driver_base import Driver
from services.common.security.channels import aio_channel
from services.common.streams import StreamProducer

__all__ = ["build_driver", "build_reconciler"]


def build_driver(
    settings: DriverSettings,
    channel: Callable[[str], grpc.aio.Channel] = aio_channel,
    sessions: KVMetaSessions | None = None,
) -> Driver:
    """``local``, ``kubernetes`` (its API client is made at ``start``) or ``dry-run``;
    ``channel`` dials the gateway replicas drained before a scale-in; ``sessions`` (kvmeta)
    migrates a drained instance's agent sessions before its removal."""
    if settings.kind == "dry-run":
        return DryRunDriver()
    drainer = Drainer(
        settings.scheduler_addresses,
        timeout_s=settings.drain_timeout_s,
        poll_s=settings.drain_poll_s,
        channel=channel,
        sessions=sessions,
    )
    if settings.kind == "local":
        return LocalDriver(settings.local, drainer)
    return KubernetesDriver(settings.kubernetes, drainer)


def build_reconciler(
    settings: DriverSettings,
    redis: aioredis.Redis | None,
    prefix: str = "ts",
    channel: Callable[[str], grpc.aio.Channel] = aio_channel,
    sessions: KVMetaSessions | None = None,
) -> Reconciler:
    """A reconciler over :func:`build_driver`; ``redis`` (a bytes client) None = no
    membership events."""
    publisher = (
        MembershipPublisher(StreamProducer(redis, maxlen=settings.membership_maxlen), prefix)
        if redis is not None
        else None
    )
    return Reconciler(build_driver(settings, channel, sessions), settings, publisher)
