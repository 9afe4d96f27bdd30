"""The bounded buffer that carries request records to ``{prefix}:requests`` off the request
path (see :mod:`services.scheduler.http.records` for what a record holds)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from tideserve.v1 import events_pb2

from services.common.streams import StreamProducer, stream_name
from services.common.tasks import pause, stop_tasks

__all__ = ["RecordSink", "make_sink"]

log = logging.getLogger(__name__)


class RecordSink:
    """Bounded buffer of records flushed to ``stream`` by a task (:meth:`start`).

    :meth:`offer` never blocks: beyond ``buffer`` records it drops (``stats['dropped']``).
    A batch that Redis refuses (an outage) goes back to the front of the buffer, in order, and
    is published again by a later flush (counted in ``errors``): records wait out an outage as
    long as the buffer holds them, and only new records beyond it are dropped. A retried batch
    may have been partly written: telemetry ingest ignores duplicates by request id.
    """

    def __init__(
        self,
        redis: aioredis.Redis | None,
        stream: str = "ts:requests",
        *,
        buffer: int = 10_000,
        batch: int = 512,
        flush_s: float = 0.05,
        maxlen: int = 100_000,
    ) -> None:
        self.stream = stream
        self._producer = StreamProducer(redis, maxlen=maxlen) if redis is not None else None
        self._buf: deque[events_pb2.RequestRecord] = deque()
        self._max = buffer
        self.batch = batch
        self.flush_s = flush_s
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.stats: dict[str, int] = {"offered": 0, "published": 0, "dropped": 0, "errors": 0}

    def __len__(self) -> int:
        return len(self._buf)

    def offer(self, record: events_pb2.RequestRecord) -> bool:
        """Queue a record; False (and counted) when the buffer is full."""
        self.stats["offered"] += 1
        if len(self._buf) >= self._max:
            self.stats["dropped"] += 1
            return False
        self._buf.append(record)
        return True

    async def flush(self) -> int:
        """Publish everything buffered now; returns how many were published. Raises
        ``RedisError``/``OSError`` after putting the failed batch back (see the class doc)."""
        done = 0
        while self._buf:
            n = min(self.batch, len(self._buf))
            batch = [self._buf.popleft() for _ in range(n)]
            if self._producer is None:
                self.stats["dropped"] += n
                continue
            try:
                await self._producer.publish_many(self.stream, batch)
            except (RedisError, OSError):
                self._buf.extendleft(reversed(batch))
                self.stats["errors"] += 1
                raise
            self.stats["published"] += n
            done += n
        return done

    async def _run(self) -> None:
        while not self._stopping.is_set():
            await pause(self._stopping, self.flush_s)
            try:
                await self.flush()
            except (RedisError, OSError) as e:
                log.warning("request records: publish to %s failed: %s", self.stream, e)
                await pause(self._stopping, 0.5)

    def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop the task and flush what is left (best effort)."""
        if self._task is not None:
            # Let a running publish finish (cancelling redis-py mid-command can hang it).
            self._stopping.set()
            await stop_tasks([self._task], grace_s=5.0, cancel_wait_s=1.0)
            self._task = None
        with contextlib.suppress(RedisError, OSError):
            await self.flush()


def make_sink(redis: aioredis.Redis | None, prefix: str = "ts", **kw: Any) -> RecordSink:
    """A sink on ``{prefix}:requests``."""
    return RecordSink(redis, stream_name(prefix, "requests"), **kw)
