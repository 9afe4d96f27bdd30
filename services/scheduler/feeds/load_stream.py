"""Engine load snapshots from Redis into the fleet.

Engines publish a ``tideserve.v1.LoadSnapshot`` on ``{prefix}:load:{deployment}`` about
every 250 ms. Every gateway replica needs every snapshot, so each reads the stream itself
with plain ``XREAD`` from the stream's last entry at start (no consumer group, nothing to
clean up, no backlog of old load figures). A snapshot is matched to a known endpoint by instance id,
else by URL; snapshots of unknown instances are counted and dropped (membership adds
endpoints, not load figures). While an endpoint's snapshots are fresh they win over the
``/metrics`` scrape, which the gateway then skips for it (:mod:`load_merge`).

:func:`apply_snapshot` is pure (fleet + message + time). :class:`LoadStream` is the shell:
``stats`` counts ``applied``, ``stale`` (older than the last applied or a repeat),
``unknown``, ``other_deployment``, ``undecodable`` and ``errors`` (Redis failures, retried).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from tideserve.v1 import events_pb2

from services.common.streams import PayloadError, decode_entry, stream_name
from services.scheduler.core.fleet import Fleet
from services.scheduler.core.load_merge import LoadReport

__all__ = ["LoadStream", "apply_snapshot", "finish_reader", "load_report"]

log = logging.getLogger(__name__)


def load_report(s: events_pb2.LoadSnapshot) -> LoadReport:
    """The fleet's load figures from a snapshot (negative counts are clamped to 0)."""
    return LoadReport(
        running=max(0, s.num_running),
        waiting=max(0, s.num_waiting),
        tokens_in_flight=max(0, s.tokens_in_flight),
        pending_prefill_tokens=max(0, s.pending_prefill_tokens),
        kv_usage=min(1.0, max(0.0, s.kv_usage)),
        prefill_tokens_per_s=max(0.0, s.prefill_tokens_per_s),
        decode_tokens_per_s=max(0.0, s.decode_tokens_per_s),
    )


def apply_snapshot(fleet: Fleet, s: events_pb2.LoadSnapshot, *, deployment: str, now: float) -> str:
    """Apply one snapshot at gateway time ``now``; returns what happened: ``applied``,
    ``stale``, ``unknown`` or ``other_deployment``."""
    if s.deployment and deployment and s.deployment != deployment:
        return "other_deployment"
    iid = fleet.resolve(s.instance_id, s.endpoint.url)
    if iid is None:
        return "unknown"
    ok = fleet.report_load(iid, load_report(s), now, source="stream", seq=(s.epoch, s.ts_ms))
    return "applied" if ok else "stale"


async def finish_reader(
    task: asyncio.Task[None] | None, stopping: asyncio.Event, block_ms: int
) -> None:
    """End a reader loop that checks ``stopping`` between blocking reads: let its current
    XREAD return (within ``block_ms``; cancelling a redis-py command mid-read can hang),
    then cancel it if it has not, waiting a bounded time."""
    stopping.set()
    if task is None:
        return
    _, pending = await asyncio.wait([task], timeout=block_ms / 1000.0 + 2.0)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=1.0)


class LoadStream:
    """Consumes one deployment's load stream into ``fleet``. ``clock`` must be the clock
    the gateway routes with. :meth:`start`/:meth:`stop` (idempotent) run the reader task;
    :meth:`poll_once` reads one batch (tests). The Redis client must use
    ``decode_responses=False``."""

    def __init__(
        self,
        redis: aioredis.Redis,
        fleet: Fleet,
        *,
        deployment: str,
        prefix: str = "ts",
        clock: Callable[[], float] = time.monotonic,
        block_ms: int = 1000,
        count: int = 1024,
    ) -> None:
        self.redis = redis
        self.fleet = fleet
        self.deployment = deployment
        self.stream = stream_name(prefix, "load", deployment)
        self.clock = clock
        self.block_ms = block_ms
        self.count = count
        self.last_id = "$"
        self.stats: dict[str, int] = {
            k: 0
            for k in ("applied", "stale", "unknown", "other_deployment", "undecodable", "errors")
        }
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def poll_once(self, block_ms: int | None = None) -> int:
        """Read and apply one batch, waiting up to ``block_ms`` (0 = answer at once).
        Returns the entries read. Raises ``RedisError``/``OSError``."""
        block = self.block_ms if block_ms is None else block_ms
        if self.last_id == "$":
            # Pin "now" to a concrete id once, so nothing published between two reads
            # is missed (XREAD from "$" each time would skip those).
            last: Any = await self.redis.xrevrange(self.stream, count=1)
            eid = last[0][0] if last else b"0-0"
            self.last_id = eid.decode() if isinstance(eid, bytes) else str(eid)
        reply: Any = await self.redis.xread(
            {self.stream: self.last_id}, count=self.count, block=block or None
        )
        n = 0
        now = self.clock()
        for _stream, entries in reply or []:
            for eid, fields in entries:
                self.last_id = eid.decode() if isinstance(eid, bytes) else str(eid)
                n += 1
                try:
                    msg = decode_entry(fields, events_pb2.LoadSnapshot)
                except PayloadError:
                    self.stats["undecodable"] += 1
                    continue
                self.stats[
                    apply_snapshot(self.fleet, msg, deployment=self.deployment, now=now)
                ] += 1
        return n

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.poll_once()
            except (RedisError, OSError) as e:
                self.stats["errors"] += 1
                log.warning("load snapshots: reading %s failed: %s", self.stream, e)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), 1.0)

    def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        await finish_reader(self._task, self._stopping, self.block_ms)
        self._task = None
