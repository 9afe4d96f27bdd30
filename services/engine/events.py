"""KV events and load snapshots → protobuf messages → Redis streams.

``kv_batch`` and ``load_snapshot`` are pure translations. :class:`EventPublisher` numbers the
batches (``seq`` contiguous from 1 per ``(instance_id, epoch)``), keeps unpublished ones in
order and publishes them with ``services.common.streams.StreamProducer`` to
``{prefix}:kv:{deployment}`` and ``{prefix}:load:{deployment}``. A batch that fails to publish
(Redis down) is retried on the next flush, so consumers see no gap unless the bounded backlog
overflows (then the oldest batches are dropped and consumers detect the gap by ``seq``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from redis.exceptions import RedisError
from tideserve.v1 import common_pb2, events_pb2

from services.common.streams import StreamProducer, stream_name
from services.engine.kvcache import KVEventKind, KVEventRecord

__all__ = ["EventPublisher", "LoadFigures", "kv_batch", "load_snapshot"]

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
        self._instance_id = instance_id
        self._epoch = epoch
        self._block_size = block_size
        self._seq = 0
        self._backlog: deque[events_pb2.KVEventBatch] = deque(maxlen=max_backlog)
        self.published = 0

    def add(self, records: Sequence[KVEventRecord], ts_ms: int) -> None:
        """Cut a batch from ``records`` (nothing if empty)."""
        if not records:
            return
        self._seq += 1
        self._backlog.append(
            kv_batch(
                records,
                deployment=self._deployment,
                instance_id=self._instance_id,
                epoch=self._epoch,
                seq=self._seq,
                ts_ms=ts_ms,
                block_size=self._block_size,
            )
        )

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
