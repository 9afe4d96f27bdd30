"""A poison KV-event batch on a real Redis: kvmeta starts anyway (its replay skips it), its
consumer group gives up on it after max_attempts deliveries (dead letter with the reason,
acknowledged) and every other batch is applied: never retried forever."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

import pytest
import redis.asyncio as aioredis
from tideserve.v1 import common_pb2, events_pb2

from services.common.kvindex import EventLike, Verdict
from services.common.streams import StreamProducer, stream_name
from services.kvmeta.index import PrefixIndex
from services.kvmeta.ingest import IndexFeeder
from tests.helpers.waits import eventually

pytestmark = pytest.mark.integration

STORED = events_pb2.KVEvent.KIND_BLOCK_STORED


class PoisonIndex(PrefixIndex):
    """A prefix index whose apply raises for instance ``poison`` (a bug an entry triggers)."""

    def apply_batch(
        self,
        deployment: str,
        instance_id: str,
        epoch: int,
        seq: int,
        events: Sequence[EventLike],
        now: float,
        continues: bool = False,
    ) -> Verdict:
        if instance_id == "poison":
            raise KeyError("an entry this index cannot apply")
        return super().apply_batch(deployment, instance_id, epoch, seq, events, now, continues)


def kv(inst: str, seq: int, hashes: list[int]) -> events_pb2.KVEventBatch:
    event = events_pb2.KVEvent(kind=STORED, tier=common_pb2.TIER_GPU, block_hashes=hashes)
    return events_pb2.KVEventBatch(
        deployment="dep", instance_id=inst, epoch=1, seq=seq, events=[event], block_size=8
    )


async def test_poison_kv_batch_is_dead_lettered_and_the_rest_applied(
    redis: aioredis.Redis,
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    stream = stream_name(prefix, "kv", "dep")
    producer = StreamProducer(redis)
    await producer.publish_many(stream, [kv("a", 1, [1, 2]), kv("poison", 1, [9]), kv("a", 2, [3])])
    feeder = IndexFeeder(
        PoisonIndex(),
        time.time,
        redis=redis,
        prefix=prefix,
        discover_interval_s=0.2,
        block_ms=50,
        claim_idle_ms=0,
        max_attempts=3,
    )
    await feeder.start()  # replays the stream first: the poison entry must not stop it
    try:
        assert feeder.replay_failed == 1
        await producer.publish(stream, kv("a", 3, [4]))

        async def given_up() -> bool:
            if await redis.xlen(stream + ":dead") != 1:  # (the group exists from then on)
                return False
            pending = await redis.xpending(stream, "kvmeta")
            return pending["pending"] == 0 and feeder.index.instances("dep")[0].last_seq == 3

        await eventually(given_up, within_s=30.0)
        rows = await redis.xrange(stream + ":dead")
        letter = events_pb2.DeadLetter.FromString(rows[0][1][b"p"])
        assert letter.group == "kvmeta"
        assert "delivery 3" in letter.error and "cannot apply" in letter.error
        assert events_pb2.KVEventBatch.FromString(letter.fields["p"]).instance_id == "poison"
        assert [i.instance_id for i in feeder.index.instances("dep")] == ["a"]
        [match] = feeder.index.match_prefix("dep", "", [1, 2, 3, 4])
        assert (match.instance_id, match.matched_blocks) == ("a", 4)
    finally:
        await feeder.stop(checkpoint=False)
