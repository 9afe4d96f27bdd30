"""Active-active gateway replicas over Redis (the shell; the decisions are the pure
:mod:`services.common.scheduling.shared_state`, which the simulator runs too).

- Routed prefixes: a pick listener on the core queues a ``RoutedPrefix`` in a bounded
  buffer (never blocks the request path; a full buffer drops and counts); a task XADDs the
  buffer to ``{prefix}:routed:{deployment}``. Every replica reads that stream itself with
  plain XREAD (no consumer group: every replica needs every entry), starting ``catchup_s``
  back, and applies the other replicas' entries to its approximate-prefix plugins. A pick
  settled as failed before its first byte is published again as ``retracted``. With a
  dispatch order, each entry also announces its pick as a carrier there, and an answered
  pick is published again as ``answered``: the other replicas' requests waiting for its
  prefix go (:func:`~services.common.scheduling.shared_state.apply_carrier`). The stream
  is trimmed to about ``maxlen`` entries.
- In-flight load: every ``heartbeat_s`` a replica writes its ``ReplicaInFlight`` into the
  hash ``{prefix}:inflight:{deployment}`` (field = replica id), reads the whole hash and
  hands the other replicas' fresh counts (younger than ``heartbeat_ttl_s``) to the fleet.
  A replica that dies stops heart-beating and its counts drop out after the TTL; a
  replica that stops cleanly deletes its field at once.

Redis outages are counted in :attr:`SharedState.stats` and retried; routing goes on with
local knowledge only. The Redis client must use ``decode_responses=False`` and no
``socket_timeout`` shorter than ``block_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from google.protobuf.message import DecodeError
from redis.exceptions import RedisError
from tideserve.v1 import events_pb2

from services.common.routing.types import Pick, RequestView
from services.common.scheduling.service import GatewayCore
from services.common.scheduling.shared_state import (
    apply_routed,
    approx_plugins,
    dead_replicas,
    heartbeat,
    merge_backlog,
    merge_in_flight,
    pick_entry,
)
from services.common.streams import Start, StreamFollower, StreamProducer, stream_name
from services.common.tasks import pause, stop_tasks
from services.scheduler.admission.dispatch import DispatchOrder

__all__ = ["SharedState"]

log = logging.getLogger(__name__)


class SharedState:
    """Shares one replica's routed prefixes and in-flight load with the others.

    ``clock`` must be the clock the gateway passes to ``core.pick`` (the prefix index
    needs one time base); ``wall`` is epoch seconds (compared across replicas).
    :meth:`start` attaches to the core and starts the tasks; :meth:`stop` is idempotent.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        core: GatewayCore,
        *,
        deployment: str,
        replica_id: str,
        prefix: str = "ts",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        heartbeat_s: float = 0.1,
        heartbeat_ttl_s: float = 3.0,
        dispatch: DispatchOrder | None = None,
        catchup_s: float = 600.0,
        buffer: int = 10_000,
        maxlen: int = 20_000,
        block_ms: int = 500,
    ) -> None:
        if not replica_id:
            raise ValueError("replica_id must be non-empty")
        if heartbeat_ttl_s <= heartbeat_s:
            raise ValueError("heartbeat_ttl_s must exceed heartbeat_s")
        self.redis = redis
        self.core = core
        self.deployment = deployment
        self.replica_id = replica_id
        self.stream = stream_name(prefix, "routed", deployment)
        self.hash_key = stream_name(prefix, "inflight", deployment)
        self.clock = clock
        self.wall = wall
        self.heartbeat_s = heartbeat_s
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.dispatch = dispatch if dispatch is not None and dispatch.enabled else None
        self.catchup_s = catchup_s
        self.block_ms = block_ms
        self._producer = StreamProducer(redis, maxlen=maxlen)
        self._buffer: deque[events_pb2.RoutedPrefix] = deque()
        self._buffer_max = buffer
        self._wake = asyncio.Event()
        self._plugins = approx_plugins(core.scheduler)
        self._max_age_s = max((p.index.ttl_s for p in self._plugins.values()), default=0.0)
        self._beats: list[events_pb2.ReplicaInFlight] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self.stats: dict[str, int] = {
            "published": 0,
            "dropped": 0,
            "applied": 0,
            "ignored": 0,
            "undecodable": 0,
            "redis_errors": 0,
            "heartbeats": 0,
        }
        self._follower = StreamFollower(
            redis,
            self.stream,
            events_pb2.RoutedPrefix,
            self._apply,
            start=Start.seconds_back(catchup_s),
            count=512,
            block_ms=block_ms,
            retry_s=0.5,
            stats=self.stats,
            stat_names={"undecodable": "undecodable", "errors": "redis_errors"},
            wall=wall,
            name="active-active",
            stopping=self._stopping,
        )

    # -- request path ---------------------------------------------------------------------
    def on_pick(self, request: RequestView, pick: Pick, now: float) -> None:
        """Pick listener: queue the routed prefix (O(1), never blocks or raises)."""
        self._queue(request, pick, retracted=False)

    def on_settle(self, request: RequestView, pick: Pick, ok: bool) -> None:
        """Settle listener: a pick that failed before its first byte is retracted; with a
        dispatch order, an answered one is announced (its followers elsewhere go)."""
        if not ok:
            self._queue(request, pick, retracted=True)
        elif self.dispatch is not None:
            self._queue(request, pick, retracted=False, answered=True)

    def _queue(
        self, request: RequestView, pick: Pick, *, retracted: bool, answered: bool = False
    ) -> None:
        entry = pick_entry(
            self.core.scheduler,
            request,
            pick,
            deployment=self.deployment,
            replica_id=self.replica_id,
            ts_ms=int(self.wall() * 1000),
            retracted=retracted,
            answered=answered,
        )
        if entry is None:
            return
        if len(self._buffer) >= self._buffer_max:
            self.stats["dropped"] += 1
            return
        self._buffer.append(entry)
        self._wake.set()

    # -- one step each (the loops call these; tests may too) ------------------------------
    async def publish_once(self) -> int:
        """XADD everything buffered in one round trip; returns how many. On a Redis error
        the batch is dropped (counted) and the error re-raised."""
        batch = list(self._buffer)
        self._buffer.clear()
        if not batch:
            return 0
        try:
            await self._producer.publish_many(self.stream, batch)
        except (RedisError, OSError):
            self.stats["dropped"] += len(batch)
            raise
        self.stats["published"] += len(batch)
        return len(batch)

    async def read_once(self, block_ms: int | None = None) -> int:
        """Read the next entries of the routed stream (blocking up to ``block_ms``) and
        apply the other replicas' ones; returns how many entries were read."""
        return await self._follower.poll_once(block_ms)

    def _apply(self, msg: events_pb2.RoutedPrefix, _entry_id: str) -> None:
        wall_ms = int(self.wall() * 1000)
        ok = apply_routed(
            self._plugins,
            msg,
            replica_id=self.replica_id,
            now=self.clock(),
            wall_ms=wall_ms,
            max_age_s=self._max_age_s,
        )
        self.stats["applied" if ok else "ignored"] += 1
        if self.dispatch is not None:
            self.dispatch.foreign(msg, self.replica_id, wall_ms)

    async def heartbeat_once(self) -> None:
        """Write this replica's in-flight counts, read every replica's, update the fleet.
        On a Redis error the last heartbeats read are re-merged (so they still expire) and
        the error re-raised."""
        now_ms = int(self.wall() * 1000)
        try:
            beat = heartbeat(
                self.core.fleet.own_in_flight(),
                deployment=self.deployment,
                replica_id=self.replica_id,
                ts_ms=now_ms,
                backlog_ms=self.dispatch.own_backlog() if self.dispatch is not None else None,
            )
            ttl_ms = int(self.heartbeat_ttl_s * 1000)
            pipe = self.redis.pipeline(transaction=False)
            pipe.hset(self.hash_key, self.replica_id, beat.SerializeToString())
            pipe.pexpire(self.hash_key, max(ttl_ms * 20, 60_000))
            pipe.hgetall(self.hash_key)
            res = await pipe.execute()
            self._beats = _parse_beats(res[2], self.stats)
            self.stats["heartbeats"] += 1
            dead = dead_replicas(self._beats, now_ms=now_ms, forget_ms=ttl_ms * 20)
            if dead:
                await self.redis.hdel(self.hash_key, *dead)
        finally:
            self._merge(now_ms)

    def _merge(self, now_ms: int) -> None:
        ttl_ms = int(self.heartbeat_ttl_s * 1000)
        self.core.fleet.set_remote_in_flight(
            merge_in_flight(self._beats, replica_id=self.replica_id, now_ms=now_ms, ttl_ms=ttl_ms)
        )
        if self.dispatch is not None:
            self.dispatch.set_foreign(
                merge_backlog(self._beats, replica_id=self.replica_id, now_ms=now_ms, ttl_ms=ttl_ms)
            )

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Attach the pick listener and start the publish, read and heartbeat tasks."""
        if self.on_pick not in self.core.pick_listeners:
            self.core.pick_listeners.append(self.on_pick)
        if self.on_settle not in self.core.settle_listeners:
            self.core.settle_listeners.append(self.on_settle)
        if not self._tasks:
            self._stopping.clear()
            self._tasks = [
                asyncio.create_task(self._publish_loop()),
                asyncio.create_task(self._follower.run()),
                asyncio.create_task(self._loop(self.heartbeat_once, self.heartbeat_s)),
            ]

    async def stop(self) -> None:
        """Detach, flush what is buffered (best effort) and leave the in-flight hash."""
        with contextlib.suppress(ValueError):
            self.core.pick_listeners.remove(self.on_pick)
        with contextlib.suppress(ValueError):
            self.core.settle_listeners.remove(self.on_settle)
        # Let the loops finish their current Redis call (a blocking XREAD returns within
        # block_ms): cancelling a redis-py command mid-read can leave it hanging.
        self._stopping.set()
        self._wake.set()
        await stop_tasks(self._tasks, grace_s=self.block_ms / 1000 + 2.0, cancel_wait_s=1.0)
        self._tasks.clear()
        with contextlib.suppress(RedisError, OSError):
            await self.publish_once()
        with contextlib.suppress(RedisError, OSError):
            await self.redis.hdel(self.hash_key, self.replica_id)

    async def _publish_loop(self) -> None:
        while not self._stopping.is_set():
            await self._wake.wait()
            self._wake.clear()
            if self._stopping.is_set():
                return  # stop() flushes what is left
            try:
                await self.publish_once()
            except (RedisError, OSError) as e:
                self.stats["redis_errors"] += 1
                log.warning("routed-prefix publish failed: %s", e)
                await pause(self._stopping, 0.5)

    async def _loop(self, step: Callable[[], Any], period: float) -> None:
        while not self._stopping.is_set():
            try:
                await step()
            except (RedisError, OSError) as e:
                self.stats["redis_errors"] += 1
                log.warning("active-active %s failed: %s", getattr(step, "__name__", ""), e)
                await pause(self._stopping, max(period, 0.5))
                continue
            await pause(self._stopping, period)


def _parse_beats(raw: Any, stats: dict[str, int]) -> list[events_pb2.ReplicaInFlight]:
    out: list[events_pb2.ReplicaInFlight] = []
    for _field, value in (raw or {}).items():
        msg = events_pb2.ReplicaInFlight()
        try:
            msg.ParseFromString(value if isinstance(value, bytes) else str(value).encode())
        except (DecodeError, ValueError):
            stats["undecodable"] += 1
            continue
        out.append(msg)
    return out
