"""Plain-XREAD cursor follower: a reader that needs every entry of one stream.

No consumer group: each follower keeps its own cursor (the id of the last entry it read),
so every replica of a reader sees every entry and nothing is left behind in Redis when it
goes away. Use it for fan-out streams (load snapshots, membership, KV events mirrored by
the scheduler, routed prefixes, resync requests); use :class:`StreamConsumer` when the
work is to be shared between the members of a group.

- Start (:class:`Start`, resolved on the first read): after the newest entry (pinned to a
  concrete id once, so nothing published between two reads is missed, as XREAD from
  ``"$"`` each time would), from the beginning, after a given id, or ``seconds`` back
  from the wall clock (the entries added in that window).
- Each entry is decoded as ``message_type`` and given to ``on_message(msg, entry_id)``
  (synchronous: the shell's apply into its pure core). An undecodable entry is counted
  and skipped, and with ``dead_letter`` (default) copied to ``{stream}:dead``. A callback
  that raises is logged and counted (``failed``) and, with ``dead_letter``, copied to
  ``{stream}:dead`` with the error: a pure apply that raised on an entry raises again, so
  it gets one attempt (poison entries never stop a follower). The cursor moves on either
  way.
- :meth:`run` retries Redis errors (counted in ``errors``) with a back-off doubling from
  ``retry_s`` to ``max_retry_s``; the cursor keeps what was read, so nothing is applied
  twice and, within what the stream retains, nothing is missed.
- :meth:`stop` sets a flag that :meth:`run` checks between reads and lets the current
  XREAD return (within ``block_ms``) before it waits for the task, and only cancels after
  a bounded grace: cancelling a redis-py command mid-read can leave the connection (and
  the task) hanging.

The Redis client must be created with ``decode_responses=False`` and its
``socket_timeout`` (if set) must exceed ``block_ms``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import redis.asyncio as aioredis
from google.protobuf.message import Message
from redis.exceptions import RedisError

from services.common.streams import codec
from services.common.streams.ids import NEWEST, ZERO, as_id, catchup_start_id, parse_id
from services.common.streams.producer import DeadLetters
from services.common.tasks import pause, stop_tasks

__all__ = ["FOLLOWER_COUNTERS", "Start", "StreamFollower", "newest_id"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

FOLLOWER_COUNTERS = ("read", "handled", "undecodable", "dead_lettered", "failed", "errors")
"""What a follower counts: entries ``read`` (all of them), ``handled`` (callback returned),
``undecodable``, ``dead_lettered`` (of those, copied to ``{stream}:dead``), ``failed``
(callback raised) and ``errors`` (failed reads: Redis errors and outages)."""


@dataclass(frozen=True)
class Start:
    """Where a follower starts reading; resolved on its first read."""

    kind: Literal["newest", "after", "back"]
    entry_id: str = ZERO
    seconds: float = 0.0

    @classmethod
    def newest(cls) -> Start:
        """After the stream's newest entry (from the beginning when it is empty)."""
        return cls("newest")

    @classmethod
    def beginning(cls) -> Start:
        """Every retained entry."""
        return cls("after", ZERO)

    @classmethod
    def after(cls, entry_id: str) -> Start:
        """The entries after ``entry_id``."""
        parse_id(entry_id)
        return cls("after", entry_id)

    @classmethod
    def seconds_back(cls, seconds: float) -> Start:
        """The entries added in the last ``seconds`` (by the follower's wall clock)."""
        if seconds < 0:
            raise ValueError("seconds must be >= 0")
        return cls("back", seconds=seconds)

    @classmethod
    def of(cls, value: Start | str) -> Start:
        """``"$"`` = :meth:`newest`, another string = :meth:`after` that id."""
        if isinstance(value, Start):
            return value
        return cls.newest() if value == NEWEST else cls.after(value)


async def newest_id(redis: aioredis.Redis, stream: str) -> str:
    """The id of ``stream``'s newest entry, ``"0-0"`` when it is empty or missing."""
    rows: Any = await redis.xrevrange(stream, count=1)
    return as_id(rows[0][0]) if rows else ZERO


class StreamFollower(Generic[M]):
    """Follows ``stream`` with plain XREAD from ``start``, ``count`` entries a read.

    ``stats`` is the dict to count into (default: a new one) and ``stat_names`` says which
    of :data:`FOLLOWER_COUNTERS` to keep there and under which key (default: all, under
    their own names), so a shell keeps its own counter names. ``after_poll(n)`` (optional)
    runs in :meth:`run` after each read of ``n`` entries, e.g. for periodic housekeeping;
    a Redis error it raises is counted and retried like a failed read. ``wall`` is epoch
    seconds (for :meth:`Start.seconds_back`); ``name`` prefixes log lines; ``stopping`` is
    the event that ends :meth:`run` (default: its own), to share with the caller's loops.

    :meth:`start` / :meth:`stop` (idempotent) run :meth:`run` as a task; :meth:`run` may
    also be awaited in a task of the caller's, ended by :meth:`request_stop`.
    :meth:`poll_once` is one step (tests, catch-up), not to be called while :meth:`run`
    is running.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        stream: str,
        message_type: type[M],
        on_message: Callable[[M, str], None],
        *,
        start: Start | str = NEWEST,
        count: int = 512,
        block_ms: int = 1000,
        retry_s: float = 1.0,
        max_retry_s: float = 5.0,
        dead_letter: bool = True,
        dead_maxlen: int = 100_000,
        after_poll: Callable[[int], Awaitable[None]] | None = None,
        stats: dict[str, int] | None = None,
        stat_names: Mapping[str, str] | None = None,
        wall: Callable[[], float] = time.time,
        name: str = "",
        stopping: asyncio.Event | None = None,
    ) -> None:
        if count <= 0 or block_ms < 0:
            raise ValueError("count must be > 0 and block_ms >= 0")
        if retry_s <= 0 or max_retry_s < retry_s:
            raise ValueError("retry_s must be > 0 and max_retry_s >= retry_s")
        names = {k: k for k in FOLLOWER_COUNTERS} if stat_names is None else dict(stat_names)
        unknown = sorted(set(names) - set(FOLLOWER_COUNTERS))
        if unknown:
            raise ValueError(f"unknown follower counters {unknown}; known: {FOLLOWER_COUNTERS}")
        codec.require_bytes_client(redis)
        self.redis = redis
        self.stream = stream
        self.message_type = message_type
        self._on_message = on_message
        self.start_at = Start.of(start)
        self.count = count
        self.block_ms = block_ms
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.dead_letter = dead_letter
        self._dead = DeadLetters(redis, stream, "", maxlen=dead_maxlen, wall=wall)
        self._after_poll = after_poll
        self._wall = wall
        self.name = name or stream
        self.stats: dict[str, int] = {} if stats is None else stats
        self._names = names
        for key in names.values():
            self.stats.setdefault(key, 0)
        self.position: str | None = None  # the last entry read; None until the start resolves
        self.caught_up = False  # a read came back with fewer than `count` entries
        self.stopping = asyncio.Event() if stopping is None else stopping
        self._task: asyncio.Task[None] | None = None

    def _count(self, counter: str, n: int = 1) -> None:
        key = self._names.get(counter)
        if key is not None:
            self.stats[key] += n

    # ------------------------------------------------------------------ cursor
    async def resolve_start(self) -> str:
        """Fix the start position (once) and return the cursor. Raises RedisError/OSError
        for :meth:`Start.newest` when Redis fails."""
        if self.position is None:
            at = self.start_at
            if at.kind == "newest":
                self.position = await newest_id(self.redis, self.stream)
            elif at.kind == "back":
                self.position = catchup_start_id(int(self._wall() * 1000), at.seconds)
            else:
                self.position = at.entry_id
        return self.position

    def seek(self, entry_id: str) -> None:
        """Read the entries after ``entry_id`` next."""
        parse_id(entry_id)
        self.position = entry_id
        self.caught_up = False

    # ------------------------------------------------------------------ one step
    async def poll_once(self, block_ms: int | None = None) -> int:
        """Read one batch after the cursor, waiting up to ``block_ms`` (default: the
        follower's; 0 = answer at once) and hand each entry to the callback; returns the
        entries read. Raises RedisError/OSError (the cursor keeps what was handled)."""
        after = await self.resolve_start()
        block = self.block_ms if block_ms is None else block_ms
        reply: Any = await self.redis.xread(
            {self.stream: after}, count=self.count, block=block or None
        )
        n = 0
        for _stream, rows in codec.stream_entries(reply):
            for raw_id, fields in rows:
                await self._take(as_id(raw_id), fields)
                n += 1
        self.caught_up = self.caught_up or n < self.count
        return n

    async def _take(self, entry_id: str, fields: Any) -> None:
        try:
            msg = codec.decode_entry(fields, self.message_type)
        except codec.PayloadError as exc:
            if self.dead_letter:
                await self._dead.put(entry_id, fields, str(exc))
                self._count("dead_lettered")
            else:
                log.debug("%s: entry %s skipped: %s", self.name, entry_id, exc)
            self._count("undecodable")
        else:
            try:
                self._on_message(msg, entry_id)
            except Exception as exc:
                self._count("failed")
                log.exception(
                    "%s: handling entry %s of %s failed", self.name, entry_id, self.stream
                )
                if self.dead_letter:
                    error = f"{self.name}: callback failed: {codec.one_line(exc)}"
                    await self._dead.put(entry_id, fields, error)
                    self._count("dead_lettered")
            else:
                self._count("handled")
        self.position = entry_id
        self._count("read")

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Read until :meth:`request_stop`; Redis errors are counted, logged and retried
        with back-off (never raised). Returns within about ``block_ms`` of the request."""
        delay = self.retry_s
        while not self.stopping.is_set():
            try:
                n = await self.poll_once()
                if self._after_poll is not None:
                    await self._after_poll(n)
            except (RedisError, OSError) as exc:
                self._count("errors")
                log.warning(
                    "%s: reading %s failed (retried in %.3gs): %s",
                    self.name,
                    self.stream,
                    delay,
                    codec.one_line(exc),
                )
                await pause(self.stopping, delay)
                delay = min(delay * 2, self.max_retry_s)
                continue
            delay = self.retry_s

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task of :meth:`start` (None before it and after :meth:`stop`)."""
        return self._task

    def start(self) -> None:
        """Run :meth:`run` in a task (no-op while one runs)."""
        if self._task is None:
            self.stopping.clear()
            self._task = asyncio.create_task(self.run(), name=f"follow {self.stream}")

    def request_stop(self) -> None:
        """Ask :meth:`run` to return after its current read (at most ``block_ms``)."""
        self.stopping.set()

    async def stop(self) -> None:
        """Request the stop, let the current read return, then end the task (cancelled only
        after a bounded grace; never waits forever). Idempotent."""
        self.request_stop()
        if self._task is not None:
            await stop_tasks([self._task], grace_s=self.block_ms / 1000.0 + 2.0, cancel_wait_s=1.0)
            self._task = None
