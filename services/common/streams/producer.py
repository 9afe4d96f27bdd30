"""Publishing protobuf messages to Redis streams (XADD, approximately trimmed)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis.asyncio as aioredis
from google.protobuf.message import Message

from services.common.streams.codec import (
    dead_letter,
    dead_letter_stream,
    encode_entry,
    require_bytes_client,
)
from services.common.streams.ids import as_id

__all__ = ["DeadLetters", "StreamProducer"]

log = logging.getLogger(__name__)


class StreamProducer:
    """Publishes protobuf messages with XADD, trimming each stream to about ``maxlen``."""

    def __init__(self, redis: aioredis.Redis, maxlen: int = 100_000) -> None:
        if maxlen <= 0:
            raise ValueError("maxlen must be positive")
        require_bytes_client(redis)
        self._redis = redis
        self.maxlen = maxlen

    async def publish(self, stream: str, msg: Message) -> str:
        """XADD ``msg`` to ``stream`` (MAXLEN ~ maxlen); returns the entry id.

        Raises ``redis.exceptions.RedisError`` when Redis is unreachable.
        """
        entry_id = await self._redis.xadd(
            stream,
            encode_entry(msg),  # type: ignore[arg-type]
            maxlen=self.maxlen,
            approximate=True,
        )
        return as_id(entry_id)

    async def publish_many(self, stream: str, msgs: Iterable[Message]) -> list[str]:
        """XADD every message in order in one pipelined round trip; returns their ids."""
        pipe = self._redis.pipeline(transaction=False)
        count = 0
        for msg in msgs:
            pipe.xadd(stream, encode_entry(msg), maxlen=self.maxlen, approximate=True)  # type: ignore[arg-type]
            count += 1
        if count == 0:
            return []
        ids = await pipe.execute()
        return [as_id(i) for i in ids]


class DeadLetters:
    """Copies the entries of ``stream`` that ``reader`` gives up on (undecodable, or a
    handler that keeps failing) as ``tideserve.v1.DeadLetter`` records to ``{stream}:dead``.
    ``reader`` is the consumer group's name, or ``""`` for a plain follower."""

    def __init__(
        self,
        redis: aioredis.Redis,
        stream: str,
        reader: str,
        *,
        maxlen: int = 100_000,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._producer = StreamProducer(redis, maxlen=maxlen)
        self.stream = stream
        self.dead_stream = dead_letter_stream(stream)
        self.reader = reader
        self._wall = wall

    async def put(self, entry_id: str, fields: Any, error: str) -> str:
        """Log and XADD one record; returns its id. Raises RedisError/OSError."""
        log.error(
            "stream %s%s: entry %s given up (%s); moved to %s",
            self.stream,
            f" group {self.reader}" if self.reader else "",
            entry_id,
            error,
            self.dead_stream,
        )
        now_ms = int(self._wall() * 1000)
        record = dead_letter(self.stream, entry_id, self.reader, error, fields, now_ms)
        return await self._producer.publish(self.dead_stream, record)
