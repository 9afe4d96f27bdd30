"""Consumer-group reader (at-least-once): one member of a group shares a stream's entries
with the other members.

Delivery is **at least once**: an entry is acknowledged only after its handler returned.
If a consumer dies or its handler raises, the entry stays pending and is reclaimed
(XAUTOCLAIM) by a consumer of the same group once it has been idle ``claim_idle_ms``; it
may therefore be handled more than once, possibly by another process. **Handlers must be
idempotent** (apply by key/version, upsert, ignore duplicates).

An entry that cannot be decoded (missing fields, wrong type name, unparsable bytes) is
logged, copied as a ``tideserve.v1.DeadLetter`` to ``{stream}:dead`` and acknowledged: the
consumer goes on. An entry whose handler keeps failing is never retried forever: see
:mod:`.poison` for the rule (transient failures are held and retried in-process, uncounted;
faults count against the entry's delivery count, and after ``max_attempts`` deliveries it is
dead-lettered with the reason and acknowledged).

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
from services.common.streams.poison import (
    DEFAULT_MAX_ATTEMPTS,
    Verdict,
    crash_loop_reason,
    failure_reason,
    failure_verdict,
    is_transient,
    overdelivered,
)
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
    held: int = 0  # transient failures: entries held for an in-process retry


Handler = Callable[[M, str], Awaitable[None]]
BatchHandler = Callable[[Sequence[tuple[str, M]]], Awaitable[None]]
"""``handler([(entry_id, msg), ...])``: a whole read's decoded entries at once."""


class StreamConsumer(Generic[M]):
    """One member ``consumer`` of consumer group ``group`` on ``stream``.

    ``handler(msg, entry_id)`` must be idempotent (see module doc). It is acknowledged
    after it returns. If it raises, ``transient(exc)`` (default :func:`.poison.is_transient`)
    decides: a transient failure holds the entry and those after it in the read, retried
    first by the next poll (:meth:`run` waits a back-off from ``retry_s`` up to
    ``max_retry_s`` between tries; XCLAIM JUSTID keeps them this consumer's without
    counting a delivery); a fault leaves the entry pending, redelivered by whichever
    consumer of the group reclaims it after ``claim_idle_ms``, until it has been delivered
    ``max_attempts`` times: then it is dead-lettered with the reason and acknowledged
    (poison entry). ``start_id`` is where a newly created group starts (``"0"`` = the whole
    stream, ``"$"`` = only new entries).

    With ``batch_handler`` instead of ``handler`` (pass ``handler=None``), each read's
    decodable entries go to one call (e.g. one database transaction) and are acknowledged
    together after it returns. If it raises a transient failure, the whole read is held as
    above; a fault makes the consumer call it again with each entry alone, so the bad ones
    are isolated and judged one by one as above while the others are acknowledged.
    Undecodable entries are dead-lettered as above.
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
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        transient: Callable[[BaseException], bool] = is_transient,
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
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self._max_attempts = max_attempts
        self._transient = transient
        self._held: list[tuple[str, Any]] = []
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

    @property
    def held(self) -> int:
        """Entries held after a transient failure, retried first by the next poll."""
        return len(self._held)

    async def _poll(self, block_ms: int) -> int:
        if self._held:
            entries = self._held
            # Keep them ours (idle reset, so no peer reclaims them meanwhile) without counting
            # a delivery: JUSTID leaves the delivery count alone.
            await self._redis.xclaim(
                self.stream,
                self.group,
                self.consumer,
                0,
                [eid for eid, _ in entries],
                justid=True,
            )
            self._held = []
            await self._process(entries)
            return len(entries)
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
        return await self._drop_overdelivered(entries)

    async def _drop_overdelivered(self, entries: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """Dead-letter (and acknowledge) the reclaimed entries delivered more than
        ``max_attempts`` times; returns the others."""
        if not entries:
            return entries
        counts = await self._delivery_counts([eid for eid, _ in entries])
        keep: list[tuple[str, Any]] = []
        gone: list[str] = []
        for entry_id, fields in entries:
            if overdelivered(counts[entry_id], self._max_attempts):
                await self._dead_letter(entry_id, fields, crash_loop_reason(counts[entry_id]))
                gone.append(entry_id)
            else:
                keep.append((entry_id, fields))
        if gone:
            await self._redis.xack(self.stream, self.group, *gone)
        return keep

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
        await self._each(entries, self._handler)

    async def _each(self, entries: Sequence[tuple[str, Any]], handler: Handler[M]) -> None:
        """Handle ``entries`` one at a time, in order; a HOLD verdict holds the entry and
        those after it. Acknowledges the handled and the dead-lettered ones."""
        acks: list[str] = []
        try:
            for i, (entry_id, fields) in enumerate(entries):
                msg = await self._decode(entry_id, fields)
                if msg is None:
                    acks.append(entry_id)
                    continue
                verdict = await self._attempt(handler(msg, entry_id), entry_id, fields)
                if verdict is Verdict.HOLD:
                    self._held = list(entries[i:])
                    return
                if verdict is not Verdict.PENDING:
                    acks.append(entry_id)
        finally:
            if acks:
                await self._redis.xack(self.stream, self.group, *acks)

    async def _decode(self, entry_id: str, fields: Any) -> M | None:
        """The entry's message, or None when it was undecodable (then dead-lettered)."""
        try:
            return decode_entry(fields, self._type)
        except PayloadError as exc:
            await self._dead_letter(entry_id, fields, str(exc))
            return None

    async def _attempt(
        self, call: Awaitable[None], entry_id: str, fields: Any, count: int = 1
    ) -> Verdict | None:
        """Await one handler call for ``entry_id`` (``count`` entries); None when it
        returned, else the verdict on the failure (a DEAD entry is already dead-lettered;
        the caller acknowledges it)."""
        try:
            await call
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.stats.failed += count
            return await self._failed(entry_id, fields, exc)
        self.stats.handled += count
        return None

    async def _failed(self, entry_id: str, fields: Any, exc: Exception) -> Verdict:
        transient = self._transient(exc)
        delivered = 0 if transient else (await self._delivery_counts([entry_id]))[entry_id]
        verdict = failure_verdict(delivered, self._max_attempts, transient)
        if verdict is Verdict.HOLD:
            self.stats.held += 1
            log.warning(
                "stream %s group %s: entry %s not handled, a dependency is unreachable (%s); "
                "held for a retry",
                self.stream,
                self.group,
                entry_id,
                one_line(exc),
            )
        elif verdict is Verdict.DEAD:
            await self._dead_letter(entry_id, fields, failure_reason(delivered, one_line(exc)))
        else:
            log.exception(
                "stream %s group %s: handler failed on entry %s (delivery %d of at most %d); "
                "left pending for retry",
                self.stream,
                self.group,
                entry_id,
                delivered,
                self._max_attempts,
            )
        return verdict

    async def _delivery_counts(self, ids: Sequence[str]) -> dict[str, int]:
        """How many times each pending id was delivered (XPENDING; 1 if it is not pending)."""
        pipe = self._redis.pipeline(transaction=False)
        for entry_id in ids:
            pipe.xpending_range(self.stream, self.group, min=entry_id, max=entry_id, count=1)
        replies = await pipe.execute()
        counts = dict.fromkeys(ids, 1)
        for entry_id, rows in zip(ids, replies, strict=True):
            if rows:
                counts[entry_id] = int(rows[0]["times_delivered"])
        return counts

    async def _process_batch(
        self, handler: BatchHandler[M], entries: Sequence[tuple[str, Any]]
    ) -> None:
        decoded: list[tuple[str, M]] = []
        raw: dict[str, Any] = {}
        acks: list[str] = []
        for entry_id, fields in entries:
            msg = await self._decode(entry_id, fields)
            if msg is None:
                acks.append(entry_id)
            else:
                decoded.append((entry_id, msg))
                raw[entry_id] = fields
        if acks:
            await self._redis.xack(self.stream, self.group, *acks)
        if not decoded:
            return
        try:
            await handler(decoded)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._transient(exc):
                self.stats.failed += len(decoded)
                await self._failed(decoded[0][0], raw[decoded[0][0]], exc)
                self._held = [(eid, raw[eid]) for eid, _ in decoded]
                return
            log.warning(
                "stream %s group %s: batch handler failed on %d entries (%s); handling them "
                "one by one to isolate the bad ones",
                self.stream,
                self.group,
                len(decoded),
                one_line(exc),
            )
            await self._one_by_one(handler, decoded, raw)
            return
        self.stats.handled += len(decoded)
        await self._redis.xack(self.stream, self.group, *(eid for eid, _ in decoded))

    async def _one_by_one(
        self, handler: BatchHandler[M], decoded: Sequence[tuple[str, M]], raw: dict[str, Any]
    ) -> None:
        async def alone(msg: M, entry_id: str) -> None:
            await handler([(entry_id, msg)])

        await self._each([(eid, raw[eid]) for eid, _ in decoded], alone)

    async def _dead_letter(self, entry_id: str, fields: Any, error: str) -> None:
        self.stats.dead += 1
        await self._dead.put(entry_id, fields, error)

    async def run(
        self, stop: asyncio.Event, *, retry_s: float = 1.0, max_retry_s: float = 5.0
    ) -> None:
        """Poll until ``stop`` is set. Redis errors and outages are logged and retried
        every ``retry_s`` (never raised); held entries (transient failures) are retried
        after a back-off doubling from ``retry_s`` to ``max_retry_s``. Returns within about
        ``block_ms`` of ``stop``."""
        delay = retry_s
        while not stop.is_set():
            try:
                await self.poll_once()
            except (RedisError, OSError) as exc:
                log.warning("stream %s: redis error (%s); retrying", self.stream, one_line(exc))
                self._group_ready = False
                await pause(stop, retry_s)
                continue
            if self._held:
                await pause(stop, delay)
                delay = min(delay * 2, max_retry_s)
            else:
                delay = retry_s
