"""Gap → resync end to end, on a real Redis: a simulated engine publishes KV events, one batch
is lost before kvmeta reads it (XDEL), kvmeta marks the instance stale and publishes a
ResyncRequest, the engine answers with its full state (one batch, or chunks), and kvmeta's
index for the instance equals the engine's cache again: not stale, MatchPrefix finds every
prefix, including the one only the lost batch announced."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestServer
from tideserve.v1 import events_pb2, kvmeta_pb2, kvmeta_pb2_grpc

from services.common.clock import ManualClock
from services.common.kvindex import ResyncPolicy
from services.common.streams import stream_name
from services.common.tokens import block_hashes, tokenize
from services.engine.server import EngineServer
from services.engine.settings import EngineSettings
from services.kvmeta.index import PrefixIndex
from services.kvmeta.ingest import IndexFeeder
from services.kvmeta.objects import ObjectMaster
from services.kvmeta.servicer import KVMetaServicer, ObjectShell, add_to_server
from tests.helpers.waits import eventually

pytestmark = pytest.mark.integration

BS = 16
DEP = "llama"
PROMPTS = [" ".join(f"p{k}w{i}" for i in range(5 * BS)) for k in range(3)]  # 5 blocks each
CLEARED = events_pb2.KVEvent.KIND_ALL_CLEARED


async def kv_batches(redis: Any, stream: str) -> list[events_pb2.KVEventBatch]:
    return [events_pb2.KVEventBatch.FromString(f[b"p"]) for _, f in await redis.xrange(stream)]


@pytest.mark.parametrize(
    ("max_blocks", "answer_batches"), [(4096, 1), (4, 4)], ids=["one-batch", "chunked"]
)
async def test_gap_resync_request_and_answer_restore_the_instance(
    tmp_path: Path, redis: aioredis.Redis, max_blocks: int, answer_batches: int
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    kv_stream = stream_name(prefix, "kv", DEP)
    engines: dict[str, EngineServer] = {}
    servers: list[TestServer] = []
    for iid in ("e1", "e2"):
        settings = EngineSettings(
            port=0,
            instance_id=iid,
            profile="test",
            speedup=20.0,
            block_size=BS,
            kv_blocks=256,
            deployment=DEP,
            stream_prefix=prefix,
            kv_flush_ms=10.0,
            load_interval_ms=1000.0,
            resync_max_blocks=max_blocks,
            state_dir=tmp_path / iid,
        )
        engines[iid] = EngineServer(settings, redis=redis)
        servers.append(TestServer(engines[iid].app(), host="127.0.0.1"))
        await servers[-1].start_server()
    kv: IndexFeeder | None = None
    grpc_server: grpc.aio.Server | None = None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            # e1 serves three prompts, one KV batch each; e2 serves the first one
            for k, text in enumerate(PROMPTS):
                url = str(servers[0].make_url("/v1/completions"))
                async with http.post(url, json={"prompt": text, "max_tokens": 1}) as resp:
                    assert resp.status == 200

                async def published(n: int = k + 1) -> bool:
                    return (
                        sum(b.instance_id == "e1" for b in await kv_batches(redis, kv_stream)) == n
                    )

                await eventually(published, within_s=20.0)
            url = str(servers[1].make_url("/v1/completions"))
            async with http.post(url, json={"prompt": PROMPTS[0], "max_tokens": 1}) as resp:
                assert resp.status == 200

        async def e2_published() -> bool:
            return any(b.instance_id == "e2" for b in await kv_batches(redis, kv_stream))

        await eventually(e2_published, within_s=20.0)
        # lose e1's second batch before kvmeta reads it
        entries = await redis.xrange(kv_stream)
        lost = [
            eid
            for eid, f in entries
            if (b := events_pb2.KVEventBatch.FromString(f[b"p"])).instance_id == "e1" and b.seq == 2
        ]
        assert len(lost) == 1 and await redis.xdel(kv_stream, *lost) == 1

        kv = IndexFeeder(
            PrefixIndex(),
            time.time,
            redis=redis,
            prefix=prefix,
            discover_interval_s=0.2,
            block_ms=100,
            claim_idle_ms=200,
            resync_policy=ResyncPolicy(retry_after_s=60.0, max_retry_after_s=60.0),
            resync_check_s=0.2,
        )
        await kv.start()
        grpc_server = grpc.aio.server()
        objects = ObjectShell(ObjectMaster(), None, ManualClock(0.0).now)
        add_to_server(KVMetaServicer(kv, objects), grpc_server)
        port = grpc_server.add_insecure_port("127.0.0.1:0")
        await grpc_server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = kvmeta_pb2_grpc.KVMetaServiceStub(channel)

            async def e1_restored() -> bool:
                resp = await stub.ListIndexedInstances(
                    kvmeta_pb2.ListIndexedInstancesRequest(deployment=DEP)
                )
                insts = {i.instance_id: i for i in resp.instances}
                e1 = insts.get("e1")
                return e1 is not None and not e1.stale and e1.last_seq == 3 + answer_batches

            await eventually(e1_restored, within_s=20.0)
            assert kv.outcomes["resync_needed"] == 1  # the gap was seen (and only that one)

            # exactly one request (one outstanding per instance), addressed to e1
            rows = await redis.xrange(stream_name(prefix, "resync", DEP))
            reqs = [events_pb2.ResyncRequest.FromString(f[b"p"]) for _, f in rows]
            assert [(r.deployment, r.instance_id, r.epoch) for r in reqs] == [
                (DEP, "e1", engines["e1"].epoch)
            ]
            assert "seq gap" in reqs[0].reason and reqs[0].requested_ms > 0

            # e1 answered with a full state in the next seqs; e2 ignored the request
            answer = [b for b in await kv_batches(redis, kv_stream) if b.seq > 3]
            assert [b.instance_id for b in answer] == ["e1"] * answer_batches
            assert [b.seq for b in answer] == list(range(4, 4 + answer_batches))
            assert answer[0].events[0].kind == CLEARED
            assert [b.full_state_continues for b in answer] == [True] * (answer_batches - 1) + [
                False
            ]
            e2_batches = [b for b in await kv_batches(redis, kv_stream) if b.instance_id == "e2"]
            assert all(e.kind != CLEARED for b in e2_batches for e in b.events)

            # kvmeta's index for e1 equals e1's cache
            cache = engines["e1"].core.cache
            resident = cache.resident()
            (info,) = [i for i in kv.index.instances(DEP) if i.instance_id == "e1"]
            assert info.blocks == sum(len(v) for v in resident.values()) == 15
            for text in PROMPTS:
                hashes = block_hashes(tokenize(text), BS)
                resp = await stub.MatchPrefix(
                    kvmeta_pb2.MatchPrefixRequest(deployment=DEP, block_hashes=hashes)
                )
                got = {m.instance_id: m.matched_blocks for m in resp.matches}
                assert got.get("e1") == cache.match(hashes) == 5
            resp = await stub.MatchPrefix(
                kvmeta_pb2.MatchPrefixRequest(
                    deployment=DEP, block_hashes=block_hashes(tokenize(PROMPTS[0]), BS)
                )
            )
            assert {m.instance_id for m in resp.matches} == {"e1", "e2"}
    finally:
        if grpc_server is not None:
            await grpc_server.stop(None)
        if kv is not None:
            await kv.stop(checkpoint=False)
        for s in servers:
            await s.close()


async def test_engine_listener_takes_only_its_own_requests_after_start(
    redis: aioredis.Redis,
) -> None:
    from services.common.streams import StreamProducer
    from services.engine.events import ResyncListener

    prefix = f"t{uuid.uuid4().hex[:8]}"
    stream = stream_name(prefix, "resync", DEP)
    prod = StreamProducer(redis)

    def req(iid: str, dep: str = DEP, reason: str = "") -> events_pb2.ResyncRequest:
        return events_pb2.ResyncRequest(deployment=dep, instance_id=iid, reason=reason)

    await prod.publish(stream, req("e1", reason="before start"))  # not for a new listener
    got: list[str] = []
    listener = ResyncListener(
        redis,
        prefix=prefix,
        deployment=DEP,
        instance_id=lambda: "e1",
        on_request=lambda r: got.append(r.reason),
        block_ms=100,
    )
    assert await listener.poll_once() == 0
    await prod.publish_many(
        stream, [req("e2", reason="other instance"), req("e1", "other-dep", "other deployment")]
    )
    await redis.xadd(stream, {b"t": b"tideserve.v1.ResyncRequest", b"p": b"\xff garbage"})
    last = await prod.publish(stream, req("e1", reason="mine"))
    while listener.last_id != last:
        await listener.poll_once()
    assert got == ["mine"] and listener.received == 1


async def test_unanswered_request_is_retried_until_a_full_state_arrives(
    redis: aioredis.Redis,
) -> None:
    """No engine listens: kvmeta repeats its request (backoff) while the instance is stale;
    a full state published by anyone ends the requests."""
    from services.common.streams import StreamProducer

    prefix = f"t{uuid.uuid4().hex[:8]}"
    kv_stream, rs_stream = stream_name(prefix, "kv", DEP), stream_name(prefix, "resync", DEP)
    prod = StreamProducer(redis)
    stored = events_pb2.KVEvent.KIND_BLOCK_STORED
    h = block_hashes(list(range(4 * BS)), BS)

    def batch(seq: int, *events: events_pb2.KVEvent) -> events_pb2.KVEventBatch:
        return events_pb2.KVEventBatch(
            deployment=DEP, instance_id="x", epoch=3, seq=seq, events=events, block_size=BS
        )

    await prod.publish_many(
        kv_stream,
        [batch(1, events_pb2.KVEvent(kind=stored, block_hashes=h[:1])), batch(3)],  # gap
    )
    kv = IndexFeeder(
        PrefixIndex(),
        time.time,
        redis=redis,
        prefix=prefix,
        block_ms=100,
        resync_policy=ResyncPolicy(retry_after_s=0.1, max_retry_after_s=0.2),
        resync_check_s=0.05,
    )
    await kv.start()
    try:

        async def asked_thrice() -> bool:  # recorded only after the publish succeeded
            sent = kv.resync_outstanding.get((DEP, "x"))
            return sent is not None and sent.attempts >= 3

        await eventually(asked_thrice, within_s=20.0)
        rows = await redis.xrange(rs_stream)
        reqs = [events_pb2.ResyncRequest.FromString(f[b"p"]) for _, f in rows]
        assert len(reqs) >= 3 and {(r.instance_id, r.epoch) for r in reqs} == {("x", 3)}
        await prod.publish(
            kv_stream,
            batch(
                4,
                events_pb2.KVEvent(kind=CLEARED),
                events_pb2.KVEvent(kind=stored, block_hashes=h),
            ),
        )

        async def answered() -> bool:
            info = kv.index.instances(DEP)[0]
            return not info.stale and not kv.resync_outstanding

        await eventually(answered, within_s=20.0)
        assert [m.matched_blocks for m in kv.index.match_prefix(DEP, "", h)] == [4]
    finally:
        await kv.stop(checkpoint=False)
