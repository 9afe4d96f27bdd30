"""Membership events from instance state changes: what the scheduler hears, and when.

:func:`to_event` (pure) maps a driver's state change to a ``tideserve.v1.MembershipEvent``:

- READY -> ``ADDED`` (state READY): the gateways route to it from now on;
- DRAINING -> ``STATE_CHANGED`` (state DRAINING): no new requests, in-flight ones finish;
- STOPPED -> ``REMOVED``;
- FAILED -> ``STATE_CHANGED`` (state FAILED): the gateways retire it until it is READY again;
- STARTING -> nothing (an instance joins only once it serves).

The instance carries its measured start-up time and restart count as labels
(``startup_ms``, ``restarts``) and the deployment role's name (``role_name``); ``epoch`` is
its restart count. :class:`MembershipPublisher` XADDs them to ``{prefix}:membership`` in
order; when Redis fails, events wait in an outbox (bounded) and go out, still in order, on
the next publish or :meth:`~MembershipPublisher.flush`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from redis.exceptions import RedisError
from tideserve.v1 import common_pb2, events_pb2

from services.common.planner.driver_base import InstanceState, InstanceStatus, Role
from services.common.streams import StreamProducer, stream_name

__all__ = ["MembershipPublisher", "to_event", "to_instance"]

log = logging.getLogger(__name__)

ME = events_pb2.MembershipEvent

_ROLE = {
    Role.WORKER: common_pb2.ROLE_WORKER,
    Role.PREFILL: common_pb2.ROLE_PREFILL,
    Role.DECODE: common_pb2.ROLE_DECODE,
    Role.KVCACHE: common_pb2.ROLE_KVCACHE,
}
_KIND = {
    "sim": common_pb2.ENGINE_KIND_SIM,
    "sglang": common_pb2.ENGINE_KIND_SGLANG,
    "vllm": common_pb2.ENGINE_KIND_VLLM,
}
_STATE = {
    InstanceState.STARTING: common_pb2.INSTANCE_STATE_STARTING,
    InstanceState.READY: common_pb2.INSTANCE_STATE_READY,
    InstanceState.DRAINING: common_pb2.INSTANCE_STATE_DRAINING,
    InstanceState.STOPPED: common_pb2.INSTANCE_STATE_STOPPED,
    InstanceState.FAILED: common_pb2.INSTANCE_STATE_FAILED,
}
_EVENT_KIND = {
    InstanceState.READY: ME.KIND_ADDED,
    InstanceState.DRAINING: ME.KIND_STATE_CHANGED,
    InstanceState.STOPPED: ME.KIND_REMOVED,
    InstanceState.FAILED: ME.KIND_STATE_CHANGED,
}


def to_instance(status: InstanceStatus, now_ms: int) -> common_pb2.Instance:
    """``status`` as a ``tideserve.v1.Instance`` (membership events, ``ListInstances``)."""
    return common_pb2.Instance(
        instance_id=status.instance_id,
        deployment=status.deployment,
        role=_ROLE[status.role],
        engine_kind=_KIND.get(status.engine_kind, common_pb2.ENGINE_KIND_UNSPECIFIED),
        endpoint=common_pb2.Endpoint(url=status.endpoint),
        state=_STATE[status.state],
        epoch=status.restarts,
        labels={
            "role_name": status.role_name,
            "startup_ms": str(status.startup_ms),
            "restarts": str(status.restarts),
        },
        updated_ms=now_ms,
    )


def to_event(status: InstanceStatus, reason: str, now_ms: int) -> events_pb2.MembershipEvent | None:
    """The event announcing ``status`` (None for STARTING); see the module docstring."""
    kind = _EVENT_KIND.get(status.state)
    if kind is None:
        return None
    return ME(kind=kind, instance=to_instance(status, now_ms), ts_ms=now_ms, reason=reason)


class MembershipPublisher:
    """Publishes membership events to ``{prefix}:membership`` through an ordered outbox
    (at most ``outbox`` events wait while Redis is down; the oldest are dropped, counted in
    ``dropped``)."""

    def __init__(self, producer: StreamProducer, prefix: str = "ts", outbox: int = 10_000) -> None:
        self.producer = producer
        self.stream = stream_name(prefix, "membership")
        self._outbox: deque[events_pb2.MembershipEvent] = deque()
        self._max = outbox
        self.published = 0
        self.dropped = 0
        self.failures = 0
        self._lock = asyncio.Lock()  # one flush at a time: order kept, nothing sent twice

    @property
    def pending(self) -> int:
        return len(self._outbox)

    async def publish(self, event: events_pb2.MembershipEvent) -> bool:
        """Queue ``event`` and flush; True when everything queued went out."""
        self._outbox.append(event)
        while len(self._outbox) > self._max:
            self._outbox.popleft()
            self.dropped += 1
        return await self.flush()

    async def flush(self) -> bool:
        """Send what waits, in order; False (one log line) when Redis fails."""
        async with self._lock:
            while self._outbox:
                try:
                    await self.producer.publish(self.stream, self._outbox[0])
                except (RedisError, OSError) as e:
                    self.failures += 1
                    log.warning(
                        "membership: %d event(s) wait, %s unreachable: %s",
                        len(self._outbox),
                        self.stream,
                        e,
                    )
                    return False
                self._outbox.popleft()
                self.published += 1
            return True
