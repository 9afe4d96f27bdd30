"""The scheduler-local KV index replica on real Redis: KVEventBatch entries published on
``{prefix}:kv:{deployment}`` (before and after it starts) are what the local lookup answers;
gaps and fleet instances without state get a ResyncRequest; settings wire it into the
gateway and the servicer (``precise_source="local"``)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio as aioredis
from tideserve.v1 import common_pb2, events_pb2

from services.common.errors import StartupError
from services.common.routing.types import RequestView
from services.common.streams import StreamProducer, decode_entry, stream_name
from services.scheduler.feeds.integrations import Integrations
from services.scheduler.feeds.kv_replica import KVReplicaFeed, LocalLookup
from services.scheduler.feeds.kv_replica_core import KVReplica
from services.scheduler.main import build_gateway
from services.scheduler.settings import SchedulerSettings
from tests.helpers.engines import until
from tests.helpers.views import request_view

DEP = "dep"
CHAIN = [101, 102, 103, 104, 105]
Kind = events_pb2.KVEvent


def batch(iid: str, seq: int, *events: events_pb2.KVEvent, epoch: int = 1,
          dep: str = DEP, continues: bool = False) -> events_pb2.KVEventBatch:  # fmt: skip
    return events_pb2.KVEventBatch(deployment=dep, instance_id=iid, epoch=epoch, seq=seq,
                                   events=list(events), block_size=64,
                                   full_state_continues=continues)  # fmt: skip


def stored(hs: list[int], tier: int = common_pb2.TIER_GPU, tenant: str = "") -> events_pb2.KVEvent:
    return Kind(kind=Kind.KIND_BLOCK_STORED, tier=tier, block_hashes=hs, tenant=tenant)  # type: ignore[arg-type]


def removed(hs: list[int]) -> events_pb2.KVEvent:
    return Kind(kind=Kind.KIND_BLOCK_REMOVED, tier=common_pb2.TIER_GPU, block_hashes=hs)


CLEARED = Kind(kind=Kind.KIND_ALL_CLEARED)


def view(hashes: list[int] = CHAIN) -> RequestView:
    return request_view(hashes=hashes, block_size=64)


def shape(found: Any) -> dict[str, tuple[int, dict[str, int]]]:
    return {k: (v.matched_blocks, dict(v.tiers)) for k, v in (found or {}).items()}


async def test_replays_the_stream_then_follows_it(redis: aioredis.Redis) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    kv = stream_name(prefix, "kv", DEP)
    pub = StreamProducer(redis)
    await pub.publish(kv, batch("a", 1, stored(CHAIN)))  # before the replica starts
    await pub.publish(kv, batch("b", 1, stored(CHAIN[:2], common_pb2.TIER_CPU)))
    replica = KVReplica()
    feed = KVReplicaFeed(redis, replica, deployment=DEP, prefix=prefix, block_ms=50)
    lookup = LocalLookup(replica, deployment=DEP)
    feed.start()
    try:
        await until(lambda: feed.caught_up and feed.stats["applied"] == 2, "replay")
        assert shape(await lookup(view(), DEP)) == {
            "a": (5, {"gpu": 5}),
            "b": (2, {"cpu": 2}),
        }
        await pub.publish_many(
            kv,
            [
                batch("a", 2, removed([103])),
                batch("a", 1, stored(CHAIN)),  # a duplicate (at-least-once): skipped
                batch("z", 1, stored(CHAIN), dep="other"),
                batch("b", 2, stored(CHAIN, tenant="salt")),
            ],
        )
        await until(lambda: feed.stats["batches"] == 6, "new entries read")
        assert feed.stats["duplicate"] == 1
        assert feed.stats["other_deployment"] == 1
        assert shape(await lookup(view(), DEP)) == {"a": (2, {"gpu": 2}), "b": (2, {"cpu": 2})}
        assert shape(await lookup(view(), DEP, "salt")) == {"b": (5, {"gpu": 5})}
        assert await lookup(view(), "other") is None  # another deployment: no answer
        await redis.xadd(kv, {b"t": b"tideserve.v1.KVEventBatch", b"p": b"\xff\xff"})
        await pub.publish(kv, batch("a", 3, CLEARED))
        await until(lambda: feed.stats["batches"] == 8, "cleared read")
        assert feed.stats["undecodable"] == 1
        assert shape(await lookup(view(), DEP)) == {"b": (2, {"cpu": 2})}
    finally:
        await feed.stop()
    assert feed._task is None


async def test_gaps_and_unknown_fleet_instances_are_asked_for_a_full_state(
    redis: aioredis.Redis,
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    kv, resync = stream_name(prefix, "kv", DEP), stream_name(prefix, "resync", DEP)
    pub = StreamProducer(redis)
    # "b"'s batches before seq 5 were trimmed from the stream: stale until a full state
    await pub.publish(kv, batch("b", 5, stored(CHAIN)))
    replica = KVReplica()
    fleet = ["b", "c"]
    feed = KVReplicaFeed(redis, replica, deployment=DEP, prefix=prefix, block_ms=50,
                         candidates=lambda: fleet, resync_check_s=0.05,
                         forget_after_s=0.2)  # fmt: skip
    lookup = LocalLookup(replica, deployment=DEP)

    async def asked() -> list[tuple[str, int]]:
        rows: Any = await redis.xrange(resync, "-", "+")
        return [
            (m.instance_id, m.epoch)
            for m in (decode_entry(f, events_pb2.ResyncRequest) for _, f in rows)
        ]

    feed.start()
    try:
        await until(lambda: feed.stats["resync_requests"] >= 2, "resync requests")
        got = await asked()
        assert ("c", 0) in got  # in the fleet, nothing retained: asked once
        assert ("b", 1) in got
        assert replica.stale_instances() == ["b"]
        assert shape(await lookup(view(), DEP)) == {}  # stale: left out of matches
        # the engine's answer: a full state in two batches
        await pub.publish_many(
            kv,
            [batch("b", 6, CLEARED, stored(CHAIN[:3]), continues=True),
             batch("b", 7, stored(CHAIN[3:]))],
        )  # fmt: skip
        await until(lambda: not replica.stale_instances(), "full state applied")
        assert shape(await lookup(view(), DEP)) == {"b": (5, {"gpu": 5})}
        # "b" leaves the fleet: forgotten after forget_after_s
        fleet[:] = ["c"]
        await until(lambda: feed.stats["dropped"] == 1, "b dropped")
        assert shape(await lookup(view(), DEP)) == {}
    finally:
        await feed.stop()


async def test_settings_wire_the_local_replica_into_gateway_and_servicer(
    redis: aioredis.Redis, redis_url: str
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    settings = SchedulerSettings(
        endpoints=["http://127.0.0.1:1/", "http://127.0.0.1:2/"],
        redis_url=redis_url,
        stream_prefix=prefix,
        deployment=DEP,
        precise_source="local",
        request_records=False,
        http_port=0,
    )
    core, gateway = build_gateway(settings)
    extras = Integrations(settings, core, gateway)
    assert isinstance(extras.lookup, LocalLookup)
    assert gateway.prefix_lookup is extras.lookup
    await extras.start()
    try:
        await StreamProducer(redis).publish(
            stream_name(prefix, "kv", DEP), batch("127.0.0.1:2", 1, stored(CHAIN))
        )
        lookup = extras.lookup
        await until(lambda: bool(lookup.lookup(view(), DEP)), "the event reached the replica")
        found = await lookup(view(), DEP, "", "")
        assert shape(found) == {"127.0.0.1:2": (5, {"gpu": 5})}
        # the routing core scores it (the prefix-estimate plugin "prefix"; its routed index is
        # still empty, so the score is the precise match)
        d = core.pick(replace(view(), prefix_matches=found), 0.0, "p1", "")
        assert d.decode.endpoint.instance_id == "127.0.0.1:2"  # type: ignore[union-attr]
        assert any(n == "prefix" and s > 0 for n, s, _ in d.decode.scores)  # type: ignore[union-attr]
    finally:
        await extras.stop()
        await extras.stop()  # idempotent


def test_local_source_needs_redis() -> None:
    settings = SchedulerSettings(endpoints=["http://127.0.0.1:1/"], precise_source="local",
                                 http_port=0)  # fmt: skip
    core, gateway = build_gateway(settings)
    with pytest.raises(StartupError, match="redis_url"):
        Integrations(settings, core, gateway)


def test_off_source_has_no_lookup() -> None:
    settings = SchedulerSettings(endpoints=["http://127.0.0.1:1/"], precise_source="off",
                                 kvmeta_address="127.0.0.1:1", http_port=0)  # fmt: skip
    core, gateway = build_gateway(settings)
    extras = Integrations(settings, core, gateway)
    assert extras.lookup is None and gateway.prefix_lookup is None
