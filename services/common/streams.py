"""Redis streams carrying protobuf payloads, with consumer groups (at-least-once).

Entry format: two fields, ``"t"`` = the message's full protobuf name (e.g.
``tideserve.v1.KVEventBatch``) and ``"p"`` = its serialized bytes.

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
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from google.protobuf.message import DecodeError, Message
from redis.exceptions import RedisError, ResponseError
from tideserve.v1 import events_pb2

__all__ = [
    "DEAD_SUFFIX",
    "ConsumerStats",
    "PayloadError",
    "StreamConsumer",
    "StreamProducer",
    "check_redis",
    "dead_letter",
    "dead_letter_stream",
    "decode_entry",
    "encode_entry",
    "stream_name",
]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

DEAD_SUFFIX = ":dead"
TYPE_FIELD = b"t"
PAYLOAD_FIELD = b"p"


# --------------------------------------------------------------------------- pure codec


def stream_name(prefix: str, kind: str, deployment: str | None = None) -> str:
    """``{prefix}:{kind}`` or ``{prefix}:{kind}:{deployment}`` (e.g. ``ts:kv:llama``)."""
    if not prefix or not kind:
        raise ValueError("stream prefix and kind must be non-empty")
    return f"{prefix}:{kind}" if deployment is None else f"{prefix}:{kind}:{deployment}"


def dead_letter_stream(stream: str) -> str:
    """Where undecodable entries of ``stream`` go."""
    return stream + DEAD_SUFFIX


class PayloadError(ValueError):
    """A stream entry that is not a valid encoding of the expected message type."""


def encode_entry(msg: Message) -> dict[bytes, bytes]:
    """Fields of the stream entry carrying ``msg``."""
    return {
        TYPE_FIELD: msg.DESCRIPTOR.full_name.encode(),
        PAYLOAD_FIELD: msg.SerializeToString(),
    }


def _field(fields: Mapping[Any, Any], name: bytes) -> bytes | None:
    value = fields.get(name)
    if value is None:
        value = fields.get(name.decode())
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes):
        return value
    return None


def decode_entry(fields: Mapping[Any, Any] | None, message_type: type[M]) -> M:
    """Parse an entry's fields into ``message_type``.

    Raises ``PayloadError`` (one-line message) when the fields are missing, name another
    type, or the bytes do not parse.
    """
    if fields is None:
        raise PayloadError("entry has no fields")
    type_name = _field(fields, TYPE_FIELD)
    payload = _field(fields, PAYLOAD_FIELD)
    expected = message_type.DESCRIPTOR.full_name
    if type_name is None or payload is None:
        raise PayloadError('entry lacks the "t" or "p" field')
    if type_name.decode(errors="replace") != expected:
        raise PayloadError(f"type {type_name.decode(errors='replace')!r}, expected {expected!r}")
    msg = message_type()
    try:
        msg.ParseFromString(payload)
    except (DecodeError, ValueError) as exc:
        raise PayloadError(f"payload does not parse as {expected}: {exc}") from exc
    return msg


def dead_letter(
    stream: str,
    entry_id: str,
    group: str,
    error: str,
    fields: Mapping[Any, Any] | None,
    now_ms: int,
) -> events_pb2.DeadLetter:
    """The DeadLetter record for an undecodable entry (field values kept as bytes)."""
    raw: dict[str, bytes] = {}
    for key, value in (fields or {}).items():
        k = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
        raw[k] = value if isinstance(value, bytes) else str(value).encode()
    return events_pb2.DeadLetter(
        stream=stream, entry_id=entry_id, group=group, error=error, fields=raw, ts_ms=now_ms
    )


def _id(entry_id: Any) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _require_bytes_client(client: aioredis.Redis) -> None:
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("decode_responses"):
        raise ValueError("streams need a Redis client with decode_responses=False")


# --------------------------------------------------------------------------- producer


class StreamProducer:
    """Publishes protobuf messages with XADD, trimming each stream to about ``maxlen``."""

    def __init__(self, redis: aioredis.Redis, maxlen: int = 100_000) -> None:
        if maxlen <= 0:
            raise ValueError("maxlen must be positive")
        _require_bytes_client(redis)
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
        return _id(entry_id)

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
        return [_id(i) for i in ids]


# --------------------------------------------------------------------------- consumer


@dataclass
class ConsumerStats:
    """Counters since the consumer was created."""

    handled: int = 0
    failed: int = 0
    dead: int = 0
    reclaimed: int = 0
    vanished: int = 0  # reclaimed pending ids whose entry had been trimmed away


Handler = Callable[[M, str], Awaitable[None]]


class StreamConsumer(Generic[M]):
    """One member ``consumer`` of consumer group ``group`` on ``stream``.

    ``handler(msg, entry_id)`` must be idempotent (see module doc). It is acknowledged
    after it returns; if it raises, the entry stays pending and is retried by whichever
    consumer of the group reclaims it after ``claim_idle_ms``. With ``max_attempts`` set,
    an entry whose handler failed that many times in this consumer is dead-lettered and
    acknowledged instead (poison message); default: retried forever. ``start_id`` is where
    a newly created group starts (``"0"`` = the whole stream, ``"$"`` = only new entries).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        stream: str,
        group: str,
        consumer: str,
        handler: Handler[M],
        message_type: type[M],
        *,
        batch: int = 256,
        block_ms: int = 1000,
        claim_idle_ms: int = 30_000,
        start_id: str = "0",
        dead_maxlen: int = 100_000,
        max_attempts: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if batch <= 0 or block_ms < 0 or claim_idle_ms < 0:
            raise ValueError("batch must be > 0, block_ms and claim_idle_ms >= 0")
        _require_bytes_client(redis)
        self._redis = redis
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self._handler = handler
        self._type = message_type
        self.batch = batch
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        self.start_id = start_id
        self._dead_maxlen = dead_maxlen
        if max_attempts is not None and max_attempts < 1:
            raise ValueError("max_attempts must be >= 1 (or None for unlimited)")
        self._max_attempts = max_attempts
        self._failures: dict[str, int] = {}
        self._clock = clock
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
        for _name, stream_entries in _stream_reply(reply):
            entries.extend((_id(eid), fields) for eid, fields in stream_entries)
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
        self._claim_cursor = _id(reply[0])
        entries = [(_id(eid), fields) for eid, fields in reply[1] if eid is not None]
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
        ids = [_id(p["message_id"]) for p in pending]
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
                        error = f"handler failed {failures} times: {_one_line(exc)}"
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

    async def _dead_letter(self, entry_id: str, fields: Any, error: str) -> None:
        self.stats.dead += 1
        dead = dead_letter_stream(self.stream)
        log.error(
            "stream %s group %s: entry %s given up (%s); moved to %s",
            self.stream,
            self.group,
            entry_id,
            error,
            dead,
        )
        record = dead_letter(
            self.stream, entry_id, self.group, error, fields, int(self._clock() * 1000)
        )
        await self._redis.xadd(
            dead,
            encode_entry(record),  # type: ignore[arg-type]
            maxlen=self._dead_maxlen,
            approximate=True,
        )

    async def run(self, stop: asyncio.Event, *, retry_s: float = 1.0) -> None:
        """Poll until ``stop`` is set. Redis errors and outages are logged and retried
        every ``retry_s`` (never raised); returns within about ``block_ms`` of ``stop``."""
        while not stop.is_set():
            try:
                await self.poll_once()
            except (RedisError, OSError) as exc:
                log.warning("stream %s: redis error (%s); retrying", self.stream, _one_line(exc))
                self._group_ready = False
                try:
                    await asyncio.wait_for(stop.wait(), timeout=retry_s)
                except TimeoutError:
                    pass


def _stream_reply(reply: Any) -> list[tuple[Any, list[Any]]]:
    """Normalise XREADGROUP replies (RESP2 list or RESP3 dict) to [(stream, entries)]."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(k, v[0] if v and isinstance(v[0], list) else v) for k, v in reply.items()]
    return [(name, entries) for name, entries in reply]


def _next_id(entry_id: str) -> str:
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


# --------------------------------------------------------------------------- health


async def check_redis(url: str, timeout_s: float = 5.0) -> None:
    """PING the Redis at ``url``; raises ``ConnectionError`` with a one-line message."""
    try:
        client = aioredis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
        )
    except (ValueError, RedisError) as exc:
        raise ConnectionError(f"redis_url {_redact(url)!r} is invalid: {_one_line(exc)}") from None
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        raise ConnectionError(f"cannot reach Redis at {_redact(url)}: {_one_line(exc)}") from None
    finally:
        await client.aclose()
