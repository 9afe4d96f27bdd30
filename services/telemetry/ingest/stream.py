"""The ``{prefix}:requests`` consumer group feeding :class:`~.pipeline.Ingest`.

At least once: a read's records are acknowledged (XACK) only after their transaction
committed (and the rejected ones were dead-lettered, one by one, with their reason). A crash
between commit and ack redelivers them; the ledger then reports them as duplicates and
nothing is stored or counted twice. Postgres down: the read is held and retried until it is
back (never dead-lettered for that); a record that makes the transaction fail otherwise is
isolated and dead-lettered after ``max_attempts`` deliveries (see
:mod:`services.common.streams.poison`).
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis
from tideserve.v1 import events_pb2

from services.common.streams import DeadLetters, StreamConsumer, encode_entry, stream_name
from services.common.streams.poison import DEFAULT_MAX_ATTEMPTS
from services.telemetry.ingest.pipeline import Ingest

__all__ = ["records_consumer"]


def records_consumer(
    redis: aioredis.Redis,
    ingest: Ingest,
    *,
    prefix: str,
    group: str,
    consumer: str,
    batch: int,
    block_ms: int,
    claim_idle_ms: int,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> StreamConsumer[events_pb2.RequestRecord]:
    stream = stream_name(prefix, "requests")
    dead = DeadLetters(redis, stream, group)

    async def handle(entries: Sequence[tuple[str, events_pb2.RequestRecord]]) -> None:
        result = await ingest.ingest([msg for _, msg in entries])
        for index, why in result.rejected:
            entry_id, msg = entries[index]
            await dead.put(entry_id, encode_entry(msg), why.line(msg.request_id))

    return StreamConsumer(
        redis,
        stream,
        group,
        consumer,
        None,
        events_pb2.RequestRecord,
        batch_handler=handle,
        batch=batch,
        block_ms=block_ms,
        claim_idle_ms=claim_idle_ms,
        max_attempts=max_attempts,
    )
