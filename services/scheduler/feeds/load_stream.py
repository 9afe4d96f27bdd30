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

import time
from collections.abc import Callable

import redis.asyncio as aioredis
from tideserve.v1 import events_pb2

from services.common.scheduling.fleet import Fleet
from services.common.scheduling.load_merge import LoadReport
from services.common.streams import Start, StreamFollower, stream_name
from services.common.streams.ids import NEWEST
from services.common.tokens.hashing import DEFAULT_BLOCK_SIZE

__all__ = ["LoadStream", "apply_snapshot", "load_report"]


def load_report(s: events_pb2.LoadSnapshot, block_size: int = DEFAULT_BLOCK_SIZE) -> LoadReport:
    """The fleet's load figures from a snapshot (negative counts are clamped to 0; the KV
    capacity in tokens: its blocks of ``block_size``, the gateway's, the engines' too)."""
    return LoadReport(
        running=max(0, s.num_running),
        waiting=max(0, s.num_waiting),
        tokens_in_flight=max(0, s.tokens_in_flight),
        pending_prefill_tokens=max(0, s.pending_prefill_tokens),
        kv_usage=min(1.0, max(0.0, s.kv_usage)),
        prefill_tokens_per_s=max(0.0, s.prefill_tokens_per_s),
        decode_tokens_per_s=max(0.0, s.decode_tokens_per_s),
        kv_capacity_tokens=max(0, s.kv_capacity_blocks) * block_size,
    )


def apply_snapshot(
    fleet: Fleet,
    s: events_pb2.LoadSnapshot,
    *,
    deployment: str,
    now: float,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> str:
    """Apply one snapshot at gateway time ``now``; returns what happened: ``applied``,
    ``stale``, ``unknown`` or ``other_deployment``."""
    if s.deployment and deployment and s.deployment != deployment:
        return "other_deployment"
    iid = fleet.resolve(s.instance_id, s.endpoint.url)
    if iid is None:
        return "unknown"
    load = load_report(s, block_size)
    ok = fleet.report_load(iid, load, now, source="stream", seq=(s.epoch, s.ts_ms))
    return "applied" if ok else "stale"


class LoadStream:
    """Follows one deployment's load stream into ``fleet`` (a :class:`StreamFollower` from
    the stream's newest entry). ``clock`` must be the clock the gateway routes with.
    :meth:`start`/:meth:`stop` (idempotent) run the reader task; :meth:`poll_once` reads one
    batch (tests). The Redis client must use ``decode_responses=False``."""

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
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        self.fleet = fleet
        self.block_size = block_size
        self.deployment = deployment
        self.stream = stream_name(prefix, "load", deployment)
        self.clock = clock
        self.block_ms = block_ms
        self.stats: dict[str, int] = {
            k: 0
            for k in ("applied", "stale", "unknown", "other_deployment", "undecodable", "errors")
        }
        self._follower = StreamFollower(
            redis,
            self.stream,
            events_pb2.LoadSnapshot,
            self._apply,
            start=Start.newest(),
            count=count,
            block_ms=block_ms,
            stats=self.stats,
            stat_names={"undecodable": "undecodable", "errors": "errors"},
            name="load snapshots",
        )

    @property
    def last_id(self) -> str:
        """The last entry read (``"$"`` until the first read pins the stream's newest)."""
        return self._follower.position or NEWEST

    def _apply(self, msg: events_pb2.LoadSnapshot, _entry_id: str) -> None:
        self.stats[
            apply_snapshot(
                self.fleet,
                msg,
                deployment=self.deployment,
                now=self.clock(),
                block_size=self.block_size,
            )
        ] += 1

    async def poll_once(self, block_ms: int | None = None) -> int:
        """Read and apply one batch, waiting up to ``block_ms`` (0 = answer at once).
        Returns the entries read. Raises ``RedisError``/``OSError``."""
        return await self._follower.poll_once(block_ms)

    def start(self) -> None:
        self._follower.start()

    async def stop(self) -> None:
        await self._follower.stop()
