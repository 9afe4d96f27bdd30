"""Publishing protobuf messages to Redis streams (XADD, approximately trimmed)."""

from __future__ import annotations

from collections.abc import Iterable

import redis.asyncio as aioredis
from google.protobuf.message import Message

from services.common.streams.codec import encode_entry, require_bytes_client
from services.common.streams.ids import as_id

__all__ = ["StreamProducer"]


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
