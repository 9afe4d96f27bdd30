"""kvmeta against real Redis and Postgres: index from streams, recovery, object master, TE metadata.

The service is assembled in-process (feeder + object shell + gRPC server on an ephemeral
port) exactly as ``services.kvmeta.main.build`` wires it, so a test can "crash" it (stop
without the final checkpoint) and start a fresh one on the same Redis stream and database.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import grpc
import pytest
import redis.asyncio as aioredis
from tideserve.v1 import common_pb2, events_pb2, kvmeta_pb2, kvmeta_pb2_grpc

from services.common import db
from services.common.clock import ManualClock
from services.common.streams import StreamProducer, stream_name
from services.common.tokens import block_hashes
from services.kvmeta.checkpoint import KVMetaStore
from services.kvmeta.engine_urls import EngineUrls
from services.kvmeta.index import PrefixIndex
from services.kvmeta.ingest import IndexFeeder
from services.kvmeta.metadata_http import MetadataServer
from services.kvmeta.objects import ObjectMaster
from services.kvmeta.servicer import KVMetaServicer, ObjectShell, add_to_server
from tests.helpers.waits import eventually

pytestmark = pytest.mark.integration

GPU, CPU = common_pb2.TIER_GPU, common_pb2.TIER_CPU
STORED = events_pb2.KVEvent.KIND_BLOCK_STORED
REMOVED = events_pb2.KVEvent.KIND_BLOCK_REMOVED
CLEARED = events_pb2.KVEvent.KIND_ALL_CLEARED
H = block_hashes(list(range(80)), 8)  # 10 chained blocks


@dataclass
class Kv:
    feeder: IndexFeeder
    objects: ObjectShell
    stub: kvmeta_pb2_grpc.KVMetaServiceStub
    clock: ManualClock


@asynccontextmanager
async def kvmeta(
    redis_url: str,
    pg_url: str,
    prefix: str,
    *,
    crash: bool = False,
    expire_after_s: float = 0.0,
    engine_urls: EngineUrls | None = None,
    **om: object,
) -> AsyncIterator[Kv]:
    await asyncio.to_thread(db.migrate, pg_url, "kvmeta")
    redis = aioredis.from_url(redis_url)
    engine = db.create_engine(pg_url, "kvmeta")
    store = KVMetaStore(engine)
    clock = ManualClock(1_000_000.0)
    feeder = IndexFeeder(
        PrefixIndex(),
        time.time,
        redis=redis,
        store=store,
        prefix=prefix,
        checkpoint_interval_s=0,
        discover_interval_s=0.2,
        block_ms=100,
        claim_idle_ms=200,
        expire_after_s=expire_after_s,
        engine_urls=engine_urls,
    )
    objects = ObjectShell(ObjectMaster(**om), store, clock.now)  # type: ignore[arg-type]
    await objects.load()
    await feeder.start()
    server = grpc.aio.server()
    add_to_server(KVMetaServicer(feeder, objects, max_match_blocks=64), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Kv(feeder, objects, kvmeta_pb2_grpc.KVMetaServiceStub(channel), clock)
    finally:
        await channel.close()
        await server.stop(None)
        await feeder.stop(checkpoint=not crash)
        await redis.aclose()
        await engine.dispose()


def batch(
    dep: str, inst: str, epoch: int, seq: int, *events: events_pb2.KVEvent
) -> events_pb2.KVEventBatch:
    return events_pb2.KVEventBatch(
        deployment=dep, instance_id=inst, epoch=epoch, seq=seq, events=events, block_size=8
    )


def ev(
    kind: int, hashes: list[int] | None = None, tier: int = GPU, tenant: str = ""
) -> events_pb2.KVEvent:
    return events_pb2.KVEvent(kind=kind, tier=tier, block_hashes=hashes or [], tenant=tenant)  # type: ignore[arg-type]


async def match(
    kv: Kv, dep: str, hashes: list[int], tenant: str = ""
) -> dict[str, tuple[int, dict[int, int]]]:
    resp = await kv.stub.MatchPrefix(
        kvmeta_pb2.MatchPrefixRequest(deployment=dep, tenant=tenant, block_hashes=hashes)
    )
    return {
        m.instance_id: (m.matched_blocks, {t.tier: t.blocks for t in m.tiers}) for m in resp.matches
    }


async def listed(kv: Kv, dep: str) -> dict[str, kvmeta_pb2.IndexedInstance]:
    resp = await kv.stub.ListIndexedInstances(
        kvmeta_pb2.ListIndexedInstancesRequest(deployment=dep)
    )
    return {i.instance_id: i for i in resp.instances}


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


async def test_index_from_stream_chain_tiers_tenants_epochs_gaps(
    redis_url: str, postgres_db_url: str, prefix: str
) -> None:
    ha = block_hashes(list(range(32)), 8, tenant="acme")
    redis = aioredis.from_url(redis_url)
    prod = StreamProducer(redis)
    kvs = stream_name(prefix, "kv", "dep")
    await prod.publish_many(
        kvs,
        [
            batch("dep", "a", 1, 1, ev(STORED, H[:4]), ev(STORED, H[4:7], CPU)),
            batch("dep", "b", 1, 1, ev(STORED, H[:3]), ev(STORED, H[4:9])),  # hole at block 3
            batch("dep", "c", 1, 1, ev(STORED, ha, tenant="acme")),
            batch("dep", "d", 1, 1, ev(STORED, H)),
            batch("dep", "d", 2, 1, ev(STORED, H[:2])),  # restart: epoch reset
            batch("dep", "e", 1, 1, ev(STORED, H)),
            batch("dep", "e", 1, 3, ev(STORED, H)),  # gap: stale, excluded
            batch("dep", "a", 1, 1, ev(STORED, H)),  # duplicate: skipped
        ],
    )
    async with kvmeta(redis_url, postgres_db_url, prefix) as kv:
        await eventually(lambda: _has(kv, "dep", 5))
        await eventually(lambda: _seq(kv, "dep", "e", 3))
        assert await match(kv, "dep", H) == {
            "a": (7, {GPU: 4, CPU: 3}),
            "b": (3, {GPU: 3}),
            "d": (2, {GPU: 2}),
        }
        assert await match(kv, "dep", ha, tenant="acme") == {"c": (4, {GPU: 4})}
        assert await match(kv, "dep", ha) == {}
        insts = await listed(kv, "dep")
        assert insts["e"].stale and not insts["a"].stale
        assert (insts["d"].epoch, insts["a"].blocks) == (2, 7)
        # a full state replacement (ALL_CLEARED first) clears the stale flag
        await prod.publish(kvs, batch("dep", "e", 1, 4, ev(CLEARED), ev(STORED, H[:5])))
        await eventually(lambda: _seq(kv, "dep", "e", 4))
        assert (await match(kv, "dep", H))["e"] == (5, {GPU: 5})
    await redis.aclose()


async def _has(kv: Kv, dep: str, n: int) -> bool:
    try:
        return len(await listed(kv, dep)) >= n
    except grpc.aio.AioRpcError:
        return False


async def _seq(kv: Kv, dep: str, inst: str, seq: int) -> bool:
    try:
        i = (await listed(kv, dep)).get(inst)
    except grpc.aio.AioRpcError:
        return False
    return i is not None and i.last_seq >= seq


async def test_crash_and_recovery_loses_nothing_acknowledged(
    redis_url: str, postgres_db_url: str, prefix: str
) -> None:
    redis = aioredis.from_url(redis_url)
    prod = StreamProducer(redis)
    kvs = stream_name(prefix, "kv", "dep")
    await prod.publish(kvs, batch("dep", "a", 1, 1, ev(STORED, H[:3])))
    async with kvmeta(redis_url, postgres_db_url, prefix, crash=True) as kv:
        await eventually(lambda: _seq(kv, "dep", "a", 1))
        assert await kv.feeder.checkpoint() == 1  # snapshot covers seq 1
        await prod.publish_many(
            kvs,
            [
                batch("dep", "a", 1, 2, ev(STORED, H[3:6])),
                batch("dep", "b", 1, 1, ev(STORED, H[:2])),
            ],
        )
        await eventually(lambda: _seq(kv, "dep", "b", 1))
        pending = await redis.xpending(kvs, "kvmeta")
        assert pending["pending"] == 0  # everything acknowledged before the crash
        before = await match(kv, "dep", H)
    # crashed: no final checkpoint; the newest checkpoint predates two acknowledged entries
    async with kvmeta(redis_url, postgres_db_url, prefix) as kv2:
        assert await match(kv2, "dep", H) == before == {"a": (6, {GPU: 6}), "b": (2, {GPU: 2})}
        await prod.publish(kvs, batch("dep", "a", 1, 3, ev(REMOVED, H[5:6])))
        await eventually(lambda: _seq(kv2, "dep", "a", 3))
        assert (await match(kv2, "dep", H))["a"] == (5, {GPU: 5})
    await redis.aclose()


async def test_ingest_over_grpc_is_durable_and_reports_resync(
    redis_url: str, postgres_db_url: str, prefix: str
) -> None:
    async with kvmeta(redis_url, postgres_db_url, prefix, crash=True) as kv:
        await kv.feeder.watch("dep")

        async def stream() -> AsyncIterator[events_pb2.KVEventBatch]:
            yield batch("dep", "a", 1, 1, ev(STORED, H[:4]))
            yield batch("dep", "a", 1, 1, ev(STORED, H[:4]))
            yield batch("dep", "z", 1, 5, ev(STORED, H[:4]))

        resp = await kv.stub.IngestEvents(stream())
        assert (resp.batches_applied, resp.batches_skipped, list(resp.resync_requested)) == (
            2,
            1,
            ["z"],
        )
    async with kvmeta(redis_url, postgres_db_url, prefix) as kv2:  # rebuilt from the stream
        await eventually(lambda: _seq(kv2, "dep", "a", 1))
        assert await match(kv2, "dep", H) == {"a": (4, {GPU: 4})}


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (
            kvmeta_pb2.MatchPrefixRequest(deployment="", block_hashes=[1]),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            kvmeta_pb2.MatchPrefixRequest(deployment="dep", block_hashes=[]),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            kvmeta_pb2.MatchPrefixRequest(deployment="dep", block_hashes=list(range(1, 100))),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            kvmeta_pb2.MatchPrefixRequest(deployment="nope", block_hashes=[1]),
            grpc.StatusCode.NOT_FOUND,
        ),
    ],
    ids=["no-deployment", "empty-hashes", "oversized", "unknown-deployment"],
)
async def test_match_prefix_bad_input(
    redis_url: str,
    postgres_db_url: str,
    prefix: str,
    request_: kvmeta_pb2.MatchPrefixRequest,
    code: grpc.StatusCode,
) -> None:
    async with kvmeta(redis_url, postgres_db_url, prefix) as kv:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await kv.stub.MatchPrefix(request_)
        assert err.value.code() == code and err.value.details()


def seg(name: str, cap: int) -> kvmeta_pb2.MountSegmentRequest:
    return kvmeta_pb2.MountSegmentRequest(
        deployment="dep",
        segment=kvmeta_pb2.Segment(
            name=name,
            instance_id=f"i-{name}",
            tier=CPU,
            capacity_bytes=cap,
            transfer_address="127.0.0.1:17001",
            base_address=1 << 40,
        ),
    )


async def test_objects_leases_pins_quota_and_persistence(
    redis_url: str, postgres_db_url: str, prefix: str
) -> None:
    async with kvmeta(redis_url, postgres_db_url, prefix, lease_s=5.0, quotas={"small": 150}) as kv:
        s = kv.stub
        await s.MountSegment(seg("s0", 400))
        await s.MountSegment(seg("s0", 400))  # idempotent
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await s.MountSegment(seg("s0", 500))
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        for n, pin in enumerate(["hard", "soft", "", ""]):
            cfg = kvmeta_pb2.ReplicaConfig(
                replica_num=1, hard_pin=pin == "hard", soft_pin=pin == "soft"
            )
            r = await s.PutStart(
                kvmeta_pb2.PutStartRequest(
                    deployment="dep", tenant="t", key=f"k{n}", size=100, config=cfg
                )
            )
            assert r.replicas[0].status == "processing" and r.replicas[0].offset >= 1 << 40
            await s.PutEnd(kvmeta_pb2.PutEndRequest(deployment="dep", tenant="t", key=f"k{n}"))
            kv.clock.advance(1)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await s.PutEnd(kvmeta_pb2.PutEndRequest(deployment="dep", tenant="t", key="k0"))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        got = await s.GetReplicaList(
            kvmeta_pb2.GetReplicaListRequest(deployment="dep", tenant="t", key="k2")
        )
        assert got.lease_expires_ms == int((kv.clock.now() + 5) * 1000)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await s.Remove(kvmeta_pb2.RemoveRequest(deployment="dep", tenant="t", key="k2"))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # full segment: a new put evicts the LRU unpinned, unleased object (k3), not k0/k1/k2
        await s.PutStart(
            kvmeta_pb2.PutStartRequest(deployment="dep", tenant="t", key="k4", size=100)
        )
        ex = await s.Exist(
            kvmeta_pb2.ExistRequest(deployment="dep", tenant="t", keys=["k0", "k1", "k2", "k3"])
        )
        assert list(ex.exists) == [True, True, True, False]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await s.PutStart(
                kvmeta_pb2.PutStartRequest(deployment="dep", tenant="small", key="x", size=200)
            )
        assert (
            err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            and "quota" in err.value.details()
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await s.BatchPutStart(
                kvmeta_pb2.BatchPutStartRequest(
                    deployment="dep", tenant="t", keys=["a", "k0"], sizes=[1, 1]
                )
            )
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        kv.clock.advance(10)
        await s.Remove(kvmeta_pb2.RemoveRequest(deployment="dep", tenant="t", key="k2"))
    async with kvmeta(redis_url, postgres_db_url, prefix) as kv2:  # state from Postgres
        ex = await kv2.stub.Exist(
            kvmeta_pb2.ExistRequest(
                deployment="dep", tenant="t", keys=["k0", "k1", "k2", "k3", "k4"]
            )
        )
        assert list(ex.exists) == [True, True, False, False, False]
        await kv2.stub.PutEnd(kvmeta_pb2.PutEndRequest(deployment="dep", tenant="t", key="k4"))
        b = await kv2.stub.BatchGetReplicaList(
            kvmeta_pb2.BatchGetReplicaListRequest(deployment="dep", tenant="t", keys=["k4", "zz"])
        )
        assert [r.error_code for r in b.results] == ["", "NOT_FOUND"]
        assert b.results[0].replicas[0].segment == "s0"


@pytest.mark.parametrize(
    ("steps", "expect"),
    [
        ([("GET", "a", None)], [(404, None)]),
        ([("PUT", "a", b'{"x":1}'), ("GET", "a", None)], [(200, None), (200, b'{"x":1}')]),
        (
            [("PUT", "a", b"1"), ("DELETE", "a", None), ("GET", "a", None)],
            [(200, None), (200, None), (404, None)],
        ),
        ([("DELETE", "a", None)], [(404, None)]),
        ([("GET", "", None)], [(400, None)]),
        (
            [
                ("PUT", "mooncake/rpc_meta/s", b"1"),
                ("PUT", "mooncake/rpc_meta/s", b"2"),
                ("GET", "mooncake/rpc_meta/s", None),
            ],
            [(200, None), (400, None), (200, b"1")],
        ),
        (
            [
                ("PUT", "mooncake/ram/s", b"1"),
                ("PUT", "mooncake/ram/s", b"2"),
                ("GET", "mooncake/ram/s", None),
            ],
            [(200, None), (200, None), (200, b"2")],
        ),
    ],
    ids=[
        "missing",
        "put-get",
        "delete",
        "delete-missing",
        "no-key",
        "rpc-meta-not-overwritten",
        "other-keys-overwritten",
    ],
)
async def test_transfer_engine_metadata_http(steps: list, expect: list) -> None:
    server = MetadataServer("127.0.0.1", 0)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            got = []
            for method, key, body in steps:
                url = f"http://127.0.0.1:{server.bound_port}/metadata"
                params = {"key": key} if key else {}
                async with http.request(method, url, params=params, data=body) as resp:
                    data = await resp.read()
                    got.append(
                        (resp.status, data if method == "GET" and resp.status == 200 else None)
                    )
            assert got == expect
    finally:
        await server.stop()


async def test_membership_removal_and_load_snapshot_expiry_drop_instances(
    redis_url: str, postgres_db_url: str, prefix: str
) -> None:
    redis = aioredis.from_url(redis_url)
    prod = StreamProducer(redis)
    kvs = stream_name(prefix, "kv", "dep")
    await prod.publish_many(
        kvs, [batch("dep", i, 1, 1, ev(STORED, H[:3])) for i in ("a", "b", "c")]
    )
    async with kvmeta(redis_url, postgres_db_url, prefix, crash=True, expire_after_s=1.0) as kv:
        await eventually(lambda: _has(kv, "dep", 3))
        gone = events_pb2.MembershipEvent(
            kind=events_pb2.MembershipEvent.KIND_REMOVED,
            instance=common_pb2.Instance(instance_id="c", deployment="dep"),
            reason="scale-in",
        )
        await prod.publish(stream_name(prefix, "membership"), gone)
        load = stream_name(prefix, "load", "dep")

        async def only_a_left() -> bool:  # "a" keeps sending load snapshots, "b" is silent
            await prod.publish(load, events_pb2.LoadSnapshot(deployment="dep", instance_id="a"))
            return set(await match(kv, "dep", H)) == {"a"}

        await eventually(only_a_left)
        assert set(await listed(kv, "dep")) == {"a"}
    async with kvmeta(redis_url, postgres_db_url, prefix) as kv2:
        # after a crash: the membership drop was checkpointed before its ack (not replayed);
        # an expiry drop is not (the silent instance expires again after the restart)
        assert "c" not in await match(kv2, "dep", H)
        assert "a" in await match(kv2, "dep", H)
    await redis.aclose()


def member(kind: int, iid: str, url: str = "") -> events_pb2.MembershipEvent:
    return events_pb2.MembershipEvent(
        kind=kind,
        instance=common_pb2.Instance(
            instance_id=iid, deployment="dep", endpoint=common_pb2.Endpoint(url=url)
        ),
    )


async def test_engine_urls_from_membership_replayed_then_followed(
    redis_url: str, postgres_db_url: str, prefix: str
) -> None:
    """Engines named as the local stack names them (not by address): their URLs are learnt
    from the membership events published before kvmeta started (replayed) and after
    (followed), and forgotten when an instance is removed."""
    added, removed = events_pb2.MembershipEvent.KIND_ADDED, events_pb2.MembershipEvent.KIND_REMOVED
    redis = aioredis.from_url(redis_url)
    prod = StreamProducer(redis)
    members = stream_name(prefix, "membership")
    await prod.publish(members, member(added, "engine-1", "http://127.0.0.1:31001"))
    await prod.publish(members, member(added, "engine-2", "http://127.0.0.1:31002"))
    await redis.xadd(members, {"t": "garbage", "p": b"x"})  # undecodable: skipped
    await prod.publish(members, member(removed, "engine-2"))
    urls = EngineUrls({"engine-9": "http://127.0.0.1:39999"})
    async with kvmeta(redis_url, postgres_db_url, prefix, engine_urls=urls):
        assert dict(urls) == {
            "engine-1": "http://127.0.0.1:31001", "engine-9": "http://127.0.0.1:39999"
        }  # fmt: skip
        await prod.publish(members, member(added, "engine-3", "http://127.0.0.1:31003"))

        async def learnt() -> bool:
            return urls.get("engine-3") == "http://127.0.0.1:31003"

        async def forgotten() -> bool:
            return "engine-1" not in urls

        await eventually(learnt)
        await prod.publish(members, member(removed, "engine-1"))
        await eventually(forgotten)
    await redis.aclose()
