"""KV events and load snapshots → protobuf messages → Redis streams.

``kv_batch`` and ``load_snapshot`` are pure translations. :class:`EventPublisher` numbers the
batches (``seq`` contiguous from 1 per ``(instance_id, epoch)``), keeps unpublished ones in
order and publishes them with ``services.common.streams.StreamProducer`` to
``{prefix}:kv:{deployment}`` and ``{prefix}:load:{deployment}``. A batch that fails to publish
(Redis down) is retried on the next flush, so consumers see no gap unless the bounded backlog
overflows (then the oldest batches are dropped and consumers detect the gap by ``seq``).

Resync: kvmeta publishes ``tideserve.v1.ResyncRequest`` on ``{prefix}:resync:{deployment}``
when it lost track of an instance. :class:`ResyncListener` reads that stream with plain XREAD
(no group: every engine sees every entry) and reports requests addressed to this instance;
the shell then queues :meth:`EventPublisher.add_full_state` with ``KVCache.full_state()``:
batches with the next seqs whose first event is ALL_CLEARED, split into chunks of at most
``max_blocks`` blocks (``full_state_continues`` on all but the last, see
:func:`full_state_batches`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from redis.exceptions import RedisError
from tideserve.v1 import common_pb2, events_pb2

from services.common.engine_core.kvcache import KVCache, KVEventKind, KVEventRecord
from services.common.streams import Start, StreamFollower, StreamProducer, stream_name

__all__ = [
    "EventPublisher",
    "LoadFigures",
    "ResyncListener",
    "chunk_full_state",
    "full_state_batches",
    "kv_batch",
    "load_snapshot",
]

log = logging.getLogger(__name__)

_KIND = {
    KVEventKind.STORED: events_pb2.KVEvent.KIND_BLOCK_STORED,
    KVEventKind.REMOVED: events_pb2.KVEvent.KIND_BLOCK_REMOVED,
    KVEventKind.ALL_CLEARED: events_pb2.KVEvent.KIND_ALL_CLEARED,
}
ROLES = {
    "aggregated": common_pb2.ROLE_WORKER,
    "prefill": common_pb2.ROLE_PREFILL,
    "decode": common_pb2.ROLE_DECODE,
}


def kv_batch(
    records: Sequence[KVEventRecord],
    *,
    deployment: str,
    instance_id: str,
    epoch: int,
    seq: int,
    ts_ms: int,
    block_size: int,
) -> events_pb2.KVEventBatch:
    batch = events_pb2.KVEventBatch(
        deployment=deployment,
        instance_id=instance_id,
        epoch=epoch,
        seq=seq,
        ts_ms=ts_ms,
        block_size=block_size,
    )
    for r in records:
        batch.events.add(
            kind=_KIND[r.kind],
            tier=common_pb2.TIER_GPU if r.kind is not KVEventKind.ALL_CLEARED else 0,
            block_hashes=list(r.block_hashes),
            parent_hash=r.parent_hash,
            token_count=r.token_count,
            tenant=r.tenant,
        )
    return batch


def chunk_full_state(
    records: Sequence[KVEventRecord], max_blocks: int
) -> list[list[KVEventRecord]]:
    """Split a full state (records in order) into chunks of at most ``max_blocks`` block
    hashes each (a record without hashes counts as one), splitting long STORED runs: the
    rest of a run continues in the next chunk with ``parent_hash`` = the last hash sent.
    Order is kept, so parents stay before children. Always at least one chunk."""
    if max_blocks <= 0:
        raise ValueError("max_blocks must be positive")
    chunks: list[list[KVEventRecord]] = [[]]
    room = max_blocks
    for rec in records:
        hashes = rec.block_hashes
        if not hashes:
            if room <= 0:
                chunks.append([])
                room = max_blocks
            chunks[-1].append(rec)
            room -= 1
            continue
        parent = rec.parent_hash
        while hashes:
            if room <= 0:
                chunks.append([])
                room = max_blocks
            part, hashes = hashes[:room], hashes[room:]
            chunks[-1].append(
                replace(
                    rec,
                    block_hashes=part,
                    parent_hash=parent,
                    token_count=len(part) * (rec.token_count // len(rec.block_hashes)),
                )
            )
            parent = part[-1]
            room -= len(part)
    return chunks


def full_state_batches(
    records: Sequence[KVEventRecord],
    *,
    max_blocks: int,
    deployment: str,
    instance_id: str,
    epoch: int,
    first_seq: int,
    ts_ms: int,
    block_size: int,
) -> list[events_pb2.KVEventBatch]:
    """A full state (``KVCache.full_state()``: ALL_CLEARED first) as consecutive batches from
    ``first_seq``; every batch but the last has ``full_state_continues`` set, so a consumer
    keeps the instance out of matches until the whole state has arrived."""
    chunks = chunk_full_state(records, max_blocks)
    out = []
    for i, chunk in enumerate(chunks):
        batch = kv_batch(
            chunk,
            deployment=deployment,
            instance_id=instance_id,
            epoch=epoch,
            seq=first_seq + i,
            ts_ms=ts_ms,
            block_size=block_size,
        )
        batch.full_state_continues = i < len(chunks) - 1
        out.append(batch)
    return out


@dataclass(frozen=True)
class LoadFigures:
    """What a load snapshot reports (filled by the shell from the core)."""

    num_running: int
    num_waiting: int
    kv_usage: float
    kv_capacity_blocks: int
    tokens_in_flight: int
    pending_prefill_tokens: int
    prefill_tps: float
    decode_tps: float
    cache_hit_rate: float


def load_snapshot(
    f: LoadFigures,
    *,
    deployment: str,
    instance_id: str,
    epoch: int,
    ts_ms: int,
    role: str,
    url: str,
    bootstrap_host: str = "",
    bootstrap_port: int = 0,
) -> events_pb2.LoadSnapshot:
    return events_pb2.LoadSnapshot(
        deployment=deployment,
        instance_id=instance_id,
        epoch=epoch,
        ts_ms=ts_ms,
        role=ROLES[role],
        num_running=f.num_running,
        num_waiting=f.num_waiting,
        kv_usage=f.kv_usage,
        kv_capacity_blocks=f.kv_capacity_blocks,
        tokens_in_flight=f.tokens_in_flight,
        pending_prefill_tokens=f.pending_prefill_tokens,
        prefill_tokens_per_s=f.prefill_tps,
        decode_tokens_per_s=f.decode_tps,
        cache_hit_rate=f.cache_hit_rate,
        endpoint=common_pb2.Endpoint(
            url=url, bootstrap_host=bootstrap_host, bootstrap_port=bootstrap_port
        ),
    )


class EventPublisher:
    """Batches KV events per flush and publishes them in order. Not concurrency-safe: one
    task calls ``flush``/``publish_load``."""

    def __init__(
        self,
        producer: StreamProducer,
        *,
        prefix: str,
        deployment: str,
        instance_id: str,
        epoch: int,
        block_size: int,
        max_backlog: int = 10_000,
    ) -> None:
        self._producer = producer
        self.kv_stream = stream_name(prefix, "kv", deployment)
        self.load_stream = stream_name(prefix, "load", deployment)
        self._deployment = deployment
        self.instance_id = instance_id  # may be set until the first batch is cut
        self._epoch = epoch
        self._block_size = block_size
        self._seq = 0
        self._backlog: deque[events_pb2.KVEventBatch] = deque(maxlen=max_backlog)
        self.published = 0
        self._prefix = prefix
        self.full_state_due: str | None = None  # why a full state is due at the next ``cut``
        self.full_states_sent = 0

    def resync_listener(self, redis: Any, block_ms: int = 1000) -> ResyncListener:
        """A listener of this instance's resync requests that marks a full state due."""
        return ResyncListener(
            redis,
            prefix=self._prefix,
            deployment=self._deployment,
            instance_id=lambda: self.instance_id,
            on_request=self.request_full_state,
            block_ms=block_ms,
        )

    def request_full_state(self, req: events_pb2.ResyncRequest) -> None:
        """A resync request for this instance: the next ``cut`` adds the full state (several
        requests before it are answered once)."""
        log.info("kvmeta asked for a full resync: %s", req.reason or "no reason given")
        self.full_state_due = req.reason or "requested"

    def cut(self, cache: KVCache, ts_ms: int, max_blocks: int = 4096) -> None:
        """Queue the cache's drained events, then, if a resync was requested, its full state
        as of this moment (both in one synchronous step, so nothing falls in between)."""
        self.add(cache.drain_events(), ts_ms)
        if self.full_state_due is not None:
            self.full_state_due = None
            self.full_states_sent += 1
            self.add_full_state(cache.full_state(), ts_ms, max_blocks)

    def add(self, records: Sequence[KVEventRecord], ts_ms: int) -> None:
        """Cut a batch from ``records`` (nothing if empty)."""
        if not records:
            return
        self._seq += 1
        self._backlog.append(
            kv_batch(
                records,
                deployment=self._deployment,
                instance_id=self.instance_id,
                epoch=self._epoch,
                seq=self._seq,
                ts_ms=ts_ms,
                block_size=self._block_size,
            )
        )

    def add_full_state(
        self, records: Sequence[KVEventRecord], ts_ms: int, max_blocks: int = 4096
    ) -> int:
        """Queue a full state (``KVCache.full_state()``) with the next seqs, after anything
        queued before. Returns the number of batches queued."""
        batches = full_state_batches(
            records,
            max_blocks=max_blocks,
            deployment=self._deployment,
            instance_id=self.instance_id,
            epoch=self._epoch,
            first_seq=self._seq + 1,
            ts_ms=ts_ms,
            block_size=self._block_size,
        )
        self._seq += len(batches)
        self._backlog.extend(batches)
        return len(batches)

    async def flush(self) -> int:
        """Publish the backlog in order; returns batches published. Keeps them on failure."""
        if not self._backlog:
            return 0
        batches = list(self._backlog)
        try:
            await self._producer.publish_many(self.kv_stream, batches)
        except (RedisError, OSError) as err:
            log.warning("kv events not published (%d batches kept): %s", len(batches), err)
            return 0
        for _ in batches:
            self._backlog.popleft()
        self.published += len(batches)
        return len(batches)

    async def publish_load(self, snap: events_pb2.LoadSnapshot) -> bool:
        try:
            await self._producer.publish(self.load_stream, snap)
        except (RedisError, OSError) as err:
            log.warning("load snapshot not published: %s", err)
            return False
        return True


class ResyncListener:
    """Reads ``{prefix}:resync:{deployment}`` with plain XREAD (every engine reads every entry)
    from the stream's newest entry at start, and calls ``on_request`` for each request
    addressed to ``instance_id()`` (a callable: the id may be settled after start). Requests
    for other instances and undecodable entries are skipped."""

    def __init__(
        self,
        redis: Any,
        *,
        prefix: str,
        deployment: str,
        instance_id: Callable[[], str],
        on_request: Callable[[events_pb2.ResyncRequest], None],
        block_ms: int = 1000,
    ) -> None:
        self.stream = stream_name(prefix, "resync", deployment)
        self.deployment = deployment
        self._instance_id = instance_id
        self._on_request = on_request
        self.block_ms = block_ms
        self.received = 0
        self._follower = StreamFollower(
            redis,
            self.stream,
            events_pb2.ResyncRequest,
            self._take,
            start=Start.newest(),
            block_ms=block_ms,
            name="resync requests",
        )

    @property
    def last_id(self) -> str | None:
        """The last entry read; None before the first read."""
        return self._follower.position

    def _take(self, req: events_pb2.ResyncRequest, _entry_id: str) -> None:
        if req.instance_id != self._instance_id() or (
            req.deployment and req.deployment != self.deployment
        ):
            return
        self.received += 1
        self._on_request(req)

    async def poll_once(self) -> int:
        """Read one reply (waiting up to ``block_ms``); returns requests for this instance.
        Raises RedisError/OSError."""
        before = self.received
        await self._follower.poll_once()
        return self.received - before

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current read (at most ``block_ms``). Preferred
        to cancelling it: cancelling a blocking redis-py read mid-command can hang."""
        self._follower.request_stop()

    async def run(self) -> None:
        """Poll until :meth:`stop`; Redis errors are logged and retried with back-off."""
        await self._follower.run()
