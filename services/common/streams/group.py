"""Consumer-group reader (at-least-once): one member of a group shares a stream's entries
with the other members.

Delivery is **at least once**: an entry is acknowledged only after its handler returned.
If a consumer dies or its handler raises, the entry stays pending and is reclaimed
(XAUTOCLAIM) by a consumer of the same group once it has been idle ``claim_idle_ms``; it
may therefore be handled more than once, possibly by another process. **Handlers must be
idempotent** (apply by key/version, upsert, ignore duplicates).

An entry that cannot be decoded (missing fields, wrong type name, unparsable bytes) is
logged, copied as a ``tideserve.v1.DeadLetter`` to ``{stream}:dead`` and acknowledged: the
consumer goes on.

The Redis client must be created with ``decode_responses=False`` (payloads are bytes).
For blocking reads its ``socket_timeout`` (if set) must exceed ``block_ms``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis.asyncio as aioredis
from google.protobuf.message import Message
from redis.exceptions import RedisError, ResponseError

from services.common.streams.codec import (
    PayloadError,
    decode_entry,
    one_line,
    require_bytes_client,
    stream_entries,
)
from services.common.streams.ids import as_id
from services.common.streams.producer import DeadLetters
from services.common.tasks import pause

__all__ = ["ConsumerStats", "StreamConsumer"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)


@dataclass
class ConsumerStats:
    """Counters since the consumer was created."""

    handled: int = 0
    failed: int = 0
    dead: int = 0
    reclaimed: int = 0
    vanished: int = 0  # reclaimed pending ids whose entry had been trimmed away


Handler = Callable[[M, str], Awaitable[None]]
BatchHandler = Callable[[Sequence[tuple[str, M]]], Awaitable[None]]
"""``handler([(entry_id, msg), ...])``: a whole read's decoded entries at once."""


class StreamConsumer(Generic[M]):
    """One member ``consumer`` of consumer group ``group`` on ``stream``.

    ``handler(msg, entry_id)`` must be idempotent (see module doc). It is acknowledged
    after it returns; if it raises, the entry stays pending and is retried by whichever
    consumer of the group reclaims it after ``claim_idle_ms``. With ``max_attempts`` set,
    an entry whose handler failed that many times in this consumer is dead-lettered and
    acknowledged instead (poison message); default: retried forever. ``start_id`` is where
    a newly created group starts (``"0"`` = the whole stream, ``"$"`` = only new entries).

    With ``batch_handler`` instead of ``handler`` (pass ``handler=None``), each read's
    decodable entries go to one call (e.g. one database transaction) and are acknowledged
    together after it returns; if it raises, all of them stay pending for a retry (the
    handler rejects bad entries itself; ``max_attempts`` does not apply). Undecodable
    entries are dead-lettered as above.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        stream: str,
        group: str,
        consumer: str,
        handler: Handler[M] | None,
        message_type: type[M],
        *,
        batch_handler: BatchHandler[M] | None = None,
        batch: int = 256,
        block_ms: int = 1000,
        claim_idle_ms: int = 30_000,
        start_id: str = "0",
        dead_maxlen: int = 100_000,
        max_attempts: int | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if batch <= 0 or block_ms < 0 or claim_idle_ms < 0:
            raise ValueError("batch must be > 0, block_ms and claim_idle_ms >= 0")
        if (handler is None) == (batch_handler is None):
            raise ValueError("pass exactly one of handler and batch_handler")
        require_bytes_client(redis)
        self._redis = redis
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self._handler = handler
        self._batch_handler = batch_handler
        self._type = message_type
        self.batch = batch
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        self.start_id = start_id
        self._dead = DeadLetters(redis, stream, group, maxlen=dead_maxlen, wall=wall)
        if max_attempts is not None and max_attempts < 1:
            raise ValueError("max_attempts must be >= 1 (or None for unlimited)")
        self._max_attempts = max_attempts
        self._failures: dict[str, int] = {}
        self._wall = wall
        self._group_ready = False
        self._claim_cursor = "0-0"
        self.stats = ConsumerStats()

    async def ensure_group(self) -> None:
        """Create the group (and the stream) if missing; an existing group is kept."""
        try:
            await self._redis.xgroup_create(
                self.stream, self.group, id=self.start_id, mkstream=True
            )
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    async def poll_once(self, block_ms: int | None = None) -> int:
        """Reclaim stale pending entries, read new ones, handle them; returns how many
        entries were taken (handled, failed or dead-lettered).

        Blocks up to ``block_ms`` (default: the consumer's) only when nothing was
        reclaimed. Raises ``RedisError`` when Redis is unreachable.
        """
        if not self._group_ready:
            await self.ensure_group()
        try:
            return await self._poll(self.block_ms if block_ms is None else block_ms)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # The stream or group was deleted under us: re-create and try once more.
            await self.ensure_group()
            return await self._poll(0)

    async def _poll(self, block_ms: int) -> int:
        entries = await self._reclaim()
        if entries:
            block: int | None = None
        else:
            block = block_ms if block_ms > 0 else None
        reply = await self._redis.xreadgroup(
            self.group, self.consumer, {self.stream: ">"}, count=self.batch, block=block
        )
        for _name, rows in stream_entries(reply):
            entries.extend((as_id(eid), fields) for eid, fields in rows)
        if not entries:
            return 0
        await self._process(entries)
        return len(entries)

    async def _reclaim(self) -> list[tuple[str, Any]]:
        """XAUTOCLAIM entries idle >= claim_idle_ms (one SCAN-like step per poll).

        Redis 6.2 returns a nil entry (without its id) for a pending entry that was trimmed
        from the stream; those ids are then found via XPENDING and acknowledged.
        """
        start = self._claim_cursor
        reply = await self._redis.xautoclaim(
            self.stream,
            self.group,
            self.consumer,
            self.claim_idle_ms,
            start_id=start,
            count=self.batch,
        )
        if not reply:
            return []
        self._claim_cursor = as_id(reply[0])
        entries = [(as_id(eid), fields) for eid, fields in reply[1] if eid is not None]
        missing = len(reply[1]) - len(entries)
        if missing:
            await self._ack_vanished(start, {eid for eid, _ in entries})
        self.stats.reclaimed += len(entries)
        return entries

    async def _ack_vanished(self, start: str, claimed: set[str]) -> None:
        """Acknowledge our pending ids at or after ``start`` whose entry no longer exists."""
        pending = await self._redis.xpending_range(
            self.stream,
            self.group,
            min=start,
            max="+",
            count=self.batch * 4,
            consumername=self.consumer,
        )
        ids = [as_id(p["message_id"]) for p in pending]
        ids = [i for i in ids if i not in claimed]
        if not ids:
            return
        pipe = self._redis.pipeline(transaction=False)
        for entry_id in ids:
            pipe.xrange(self.stream, min=entry_id, max=entry_id, count=1)
        found = await pipe.execute()
        gone = [i for i, rows in zip(ids, found, strict=True) if not rows]
        if gone:
            log.warning(
                "stream %s group %s: %d pending entries were trimmed before being handled",
                self.stream,
                self.group,
                len(gone),
            )
            await self._redis.xack(self.stream, self.group, *gone)
            self.stats.vanished += len(gone)

    async def _process(self, entries: Sequence[tuple[str, Any]]) -> None:
        if self._batch_handler is not None:
            await self._process_batch(self._batch_handler, entries)
            return
        assert self._handler is not None
        acks: list[str] = []
        try:
            for entry_id, fields in entries:
                try:
                    msg = decode_entry(fields, self._type)
                except PayloadError as exc:
                    await self._dead_letter(entry_id, fields, str(exc))
                    acks.append(entry_id)
                    continue
                try:
                    await self._handler(msg, entry_id)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.stats.failed += 1
                    failures = self._failures.get(entry_id, 0) + 1
                    if self._max_attempts is not None and failures >= self._max_attempts:
                        self._failures.pop(entry_id, None)
                        error = f"handler failed {failures} times: {one_line(exc)}"
                        await self._dead_letter(entry_id, fields, error)
                        acks.append(entry_id)
                        continue
                    self._failures[entry_id] = failures
                    log.exception(
                        "stream %s group %s: handler failed on entry %s; left pending for retry",
                        self.stream,
                        self.group,
                        entry_id,
                    )
                    continue
                self._failures.pop(entry_id, None)
                self.stats.handled += 1
                acks.append(entry_id)
        finally:
            if acks:
                await self._redis.xack(self.stream, self.group, *acks)

    async def _process_batch(
        self, handler: BatchHandler[M], entries: Sequence[tuple[str, Any]]
    ) -> None:
        decoded: list[tuple[str, M]] = []
        acks: list[str] = []
        for entry_id, fields in entries:
            try:
                decoded.append((entry_id, decode_entry(fields, self._type)))
            except PayloadError as exc:
                await self._dead_letter(entry_id, fields, str(exc))
                acks.append(entry_id)
        if acks:
            await self._redis.xack(self.stream, self.group, *acks)
        if not decoded:
            return
        try:
            await handler(decoded)
        except asyncio.CancelledError:
            raise
        except Exception:
            self.stats.failed += len(decoded)
            log.exception(
                "stream %s group %s: batch handler failed on %d entries; left pending for retry",
                self.stream,
                self.group,
                len(decoded),
            )
            return
        self.stats.handled += len(decoded)
        await self._redis.xack(self.stream, self.group, *(eid for eid, _ in decoded))

    async def _dead_letter(self, entry_id: str, fields: Any, error: str) -> None:
        self.stats.dead += 1
        await self._dead.put(entry_id, fields, error)

    async def run(self, stop: asyncio.Event, *, retry_s: float = 1.0) -> None:
        """Poll until ``stop`` is set. Redis errors and outages are logged and retried
        every ``retry_s`` (never raised); returns within about ``block_ms`` of ``stop``."""
        while not stop.is_set():
            try:
                await self.poll_once()
            except (RedisError, OSError) as exc:
                log.warning("stream %s: redis error (%s); retrying", self.stream, one_line(exc))
                self._group_ready = False
                await pause(stop, retry_s)
