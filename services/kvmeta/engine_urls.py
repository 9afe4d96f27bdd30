"""Where kvmeta reaches an engine's HTTP API (retention, prefetch, migration): instance id ->
base URL.

Three sources, the first that knows the instance wins:

1. the configured ``retention_engine_urls``;
2. the instance's endpoint in the autoscaler's membership events (``{prefix}:membership``).
   The local stack names its engines ``engine-1``, ``prefill-1``..., Kubernetes by pod, so
   their ids are not addresses;
3. an id of the form host:port, as ``http://host:port`` (:func:`engine_url`).

The membership view is rebuilt at start by replaying the stream (its events are idempotent
state changes applied in order, as the gateways rebuild their membership) and then follows
the events kvmeta's feeder consumes. Ids are taken as unique across deployments: two
deployments with an instance of the same id share one entry (the newest event's).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from tideserve.v1 import common_pb2, events_pb2

from services.common.streams import decode_entry
from services.common.streams.ids import ZERO, as_id, exclusive

__all__ = ["GONE_STATES", "EngineUrls", "engine_url", "replay_membership"]

log = logging.getLogger(__name__)

GONE_STATES = (common_pb2.INSTANCE_STATE_STOPPED, common_pb2.INSTANCE_STATE_FAILED)


def engine_url(instance: str, urls: Mapping[str, str]) -> str | None:
    """The engine's base URL (module doc), or None when it cannot be reached."""
    if instance in urls:
        return urls[instance].rstrip("/")
    host, sep, port = instance.rpartition(":")
    if sep and host and port.isdigit():
        return f"http://{instance}"
    return None


class EngineUrls(Mapping[str, str]):
    """The configured URLs over the ones learnt from membership events (module doc)."""

    def __init__(self, configured: Mapping[str, str] | None = None) -> None:
        self.configured = {k: v.rstrip("/") for k, v in (configured or {}).items()}
        self.learnt: dict[str, str] = {}

    def __getitem__(self, instance: str) -> str:
        found = self.configured.get(instance)
        return found if found is not None else self.learnt[instance]

    def __iter__(self) -> Iterator[str]:
        return iter({**self.learnt, **self.configured})

    def __len__(self) -> int:
        return len(self.learnt.keys() | self.configured.keys())

    def apply(self, msg: events_pb2.MembershipEvent) -> None:
        """One membership event: an instance added or changed with an endpoint URL is learnt
        (an event without one keeps what was learnt), a removed or stopped one forgotten."""
        inst = msg.instance
        if not inst.instance_id:
            return
        if msg.kind == events_pb2.MembershipEvent.KIND_REMOVED or inst.state in GONE_STATES:
            self.learnt.pop(inst.instance_id, None)
        elif inst.endpoint.url:
            self.learnt[inst.instance_id] = inst.endpoint.url.rstrip("/")


async def replay_membership(redis: aioredis.Redis, stream: str, urls: EngineUrls) -> int:
    """Apply every entry of the membership ``stream`` to ``urls``; how many were applied.
    An undecodable entry is skipped (the feeder's consumer dead-letters it); a Redis error
    ends the replay with what was applied (the consumer follows from there)."""
    n, cursor = 0, ZERO
    try:
        while True:
            rows = await redis.xrange(stream, min=exclusive(cursor), max="+", count=1000)
            if not rows:
                return n
            for raw_id, fields in rows:
                cursor = as_id(raw_id)
                try:
                    msg = decode_entry(fields, events_pb2.MembershipEvent)
                except ValueError:
                    continue
                urls.apply(msg)
                n += 1
    except RedisError as e:
        log.warning("membership replay for engine URLs stopped after %d entries: %s", n, e)
        return n
