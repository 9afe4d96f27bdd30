"""Prefetch, live: an agent session's prefix, offloaded from its engine to the KV-cache tier
by kvmeta's retention controller, is brought back to that engine before the session's
predicted return, and the next turn finds it cached (fetched by the prefetch, not computed,
and not fetched again on arrival).

Everything real but the clock kvmeta plans with (a manual one, so the test says when the
predicted return is near): kvmeta's gRPC service in process with its session table on
Postgres, its prefix index fed from Redis streams and its object master; a ``tideserve
engine --role kvcache`` process holding the tier's DRAM segment; an engine simulator with
the tier (offloading on eviction, or writing through) publishing its KV events to Redis; the Mooncake Transfer
Engine over TCP on loopback.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import redis.asyncio as aioredis
from tideserve.v1 import kvmeta_pb2, kvmeta_pb2_grpc

from services.common import db
from services.common.clock import ManualClock
from services.common.dataplane.tier import block_key
from services.common.sessions import Session, SessionTable, ToolTimePredictor
from services.common.tokens import block_hashes, tokenize
from services.engine.server import EngineServer
from services.kvmeta.fetchable import on_gpu_and_tier
from services.kvmeta.index import PrefixIndex
from services.kvmeta.ingest import IndexFeeder
from services.kvmeta.objects import ObjectMaster
from services.kvmeta.rebalance import Rebalancer
from services.kvmeta.retention import RetentionController
from services.kvmeta.servicer import KVMetaServicer, ObjectShell, add_to_server
from services.kvmeta.sessions import SessionShell, SessionStore
from tests.helpers.dataplane import metadata_url_or_skip
from tests.helpers.engines import EngineFleet
from tests.helpers.waits import bounded, eventually
from tests.integration._engine_proc import engine_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DEP = "pf"
LONG = " ".join(f"w{i}" for i in range(700))  # 10 full blocks of 64 tokens + a tail
OTHER = " ".join(f"v{i}" for i in range(700))
GAP_S = 30.0  # the predicted tool time (no history: the default gap)
GPU, CPU = 1, 2


@pytest.fixture(scope="module")
def metadata_url() -> Iterator[str]:
    yield from metadata_url_or_skip()


@dataclass
class KVMeta:
    address: str
    stub: kvmeta_pb2_grpc.KVMetaServiceStub
    shell: SessionShell
    feeder: IndexFeeder
    master: ObjectMaster
    prefix: str
    redis: aioredis.Redis


@asynccontextmanager
async def kvmeta(pg_url: str, redis_url: str, clock: ManualClock) -> AsyncIterator[KVMeta]:
    await asyncio.to_thread(db.migrate, pg_url, "kvmeta")
    dbe = db.create_engine(pg_url, "kvmeta")
    redis = aioredis.Redis.from_url(redis_url, decode_responses=False)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    shell = SessionShell(SessionTable(ToolTimePredictor(default_gap_s=GAP_S)),
                         SessionStore(dbe), clock.now)  # fmt: skip
    await shell.load()
    feeder = IndexFeeder(PrefixIndex(), time.time, redis=redis, prefix=prefix,
                         checkpoint_interval_s=0, discover_interval_s=0.1, block_ms=50)  # fmt: skip
    await feeder.start()
    master = ObjectMaster()
    server = grpc.aio.server()
    add_to_server(KVMetaServicer(feeder, ObjectShell(master, None, time.time), sessions=shell),
                  server)  # fmt: skip
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield KVMeta(f"127.0.0.1:{port}", kvmeta_pb2_grpc.KVMetaServiceStub(channel), shell,
                     feeder, master, prefix, redis)  # fmt: skip
    finally:
        await channel.close()
        await bounded(server.stop(None), "stopping kvmeta's gRPC server")
        await bounded(feeder.stop(checkpoint=False), "stopping kvmeta's feeder")
        await bounded(redis.aclose(), "closing the Redis client")
        await dbe.dispose()


@asynccontextmanager
async def with_tier(
    pg_url: str, redis_url: str, metadata_url: str, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[tuple[KVMeta, aiohttp.ClientSession]]:
    """kvmeta, a ``kvcache`` process holding the tier's DRAM segment, and an HTTP client."""
    async with (
        kvmeta(pg_url, redis_url, clock) as kv,
        engine_process(
            tmp_path / "kvcache", "--role", "kvcache", "--kvcache-mib", "4",
            "--deployment", DEP, "--te-metadata-url", metadata_url,
            "--kvmeta-address", kv.address,
        ),
        aiohttp.ClientSession() as http,
    ):  # fmt: skip
        yield kv, http


async def complete(http: aiohttp.ClientSession, url: str, prompt: str = LONG) -> dict[str, Any]:
    async with http.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4}) as r:
        assert r.status == 200, await r.text()
        return dict(await r.json())


def on_engine(kv: KVMeta, chain: list[int]) -> dict[int, int]:
    """The tiers kvmeta's index holds the chain in on e0 (its view from the KV events)."""
    try:
        found = kv.feeder.index.match_prefix(DEP, "", chain)
    except LookupError:  # the deployment is not known yet
        return {}
    return next((dict(m.tiers) for m in found if m.instance_id == "e0"), {})


@pytest.mark.parametrize(
    "policy", ["offload_on_evict", "write_through"], ids=["offload-on-evict", "write-through"]
)
async def test_offloaded_session_is_prefetched_before_its_next_turn(
    postgres_db_url: str, redis_url: str, metadata_url: str, tmp_path: Path, policy: str
) -> None:
    clock = ManualClock(1_000_000.0)
    key = {"deployment": DEP, "tenant": "", "session_id": "agent-1"}
    skey = (DEP, "", "agent-1")
    async with with_tier(postgres_db_url, redis_url, metadata_url, tmp_path, clock) as (kv, http):
        fleet = EngineFleet(tmp_path, serve="runner", profile="test", speedup=20.0,
                            deployment=DEP, kvcache_tier=True, kvcache_policy=policy,
                            kvmeta_address=kv.address, te_metadata_url=metadata_url,
                            stream_prefix=kv.prefix, kv_flush_ms=10.0)  # fmt: skip
        # budget 0, eager: an idle session is offloaded at once, whatever its predicted return
        ctl = RetentionController(
            kv.shell, mode="enforce", budget_share=0.0, tick_s=0.1, keep_unprotected=False
        )
        try:
            engine, url = await fleet.start(redis=kv.redis, instance_id="e0")
            ctl.urls["e0"] = url
            assert engine.tier_io is not None
            await _run(kv, ctl, engine, url, http, clock, key, skey)
        finally:
            await ctl.close()
            await bounded(fleet.close(), "closing the engine")


async def _run(
    kv: KVMeta,
    ctl: RetentionController,
    engine: EngineServer,
    url: str,
    http: aiohttp.ClientSession,
    clock: ManualClock,
    key: dict[str, str],
    skey: tuple[str, str, str],
) -> None:
    chain, want, returns_at = await _first_turn(kv, engine, url, http, clock, key, skey)
    # the controller offloads it to the tier
    await ctl.tick()
    await _gone_to_tier(kv, engine, chain)
    assert dict(kv.shell.table.get(skey).tiers) == {CPU: 10}
    await _prefetch_and_next_turn(kv, ctl, engine, url, http, clock, key, skey, want, returns_at)


async def _first_turn(
    kv: KVMeta,
    engine: EngineServer,
    url: str,
    http: aiohttp.ClientSession,
    clock: ManualClock,
    key: dict[str, str],
    skey: tuple[str, str, str],
) -> tuple[list[int], dict[str, Any], float]:
    """Turn 1, served on e0 and reported as the gateway reports it, until kvmeta's index
    has its chain on e0's GPU: the chain, the answer and the predicted return."""
    assert engine.tier_io is not None
    chain, want = await _turn(
        kv, http, url, "e0", key["session_id"], LONG, engine.settings.block_size
    )
    assert len(chain) == 10
    returns_at = kv.shell.table.get(skey).predicted_return_at
    assert returns_at == pytest.approx(clock.now() + GAP_S)

    async def indexed() -> bool:
        return on_engine(kv, chain) == {GPU: 10}

    await eventually(indexed)
    return chain, want, returns_at


async def test_kept_session_evicted_on_demand_is_recorded_and_prefetched(
    postgres_db_url: str, redis_url: str, metadata_url: str, tmp_path: Path
) -> None:
    """Keep-while-room: the controller leaves the idle session on the GPU (no pressure);
    another prompt makes the engine evict it, to the tier (offload on eviction); the
    controller records it there from the index's KV events and the tier's objects, and the
    prefetch brings it back before its next turn as for one it offloaded itself."""
    clock = ManualClock(1_000_000.0)
    key = {"deployment": DEP, "tenant": "", "session_id": "agent-2"}
    skey = (DEP, "", "agent-2")
    async with with_tier(postgres_db_url, redis_url, metadata_url, tmp_path, clock) as (kv, http):
        fleet = EngineFleet(tmp_path, serve="runner", profile="test", speedup=20.0,
                            deployment=DEP, kvcache_tier=True, kvcache_policy="offload_on_evict",
                            kvmeta_address=kv.address, te_metadata_url=metadata_url,
                            stream_prefix=kv.prefix, kv_flush_ms=10.0,
                            kv_blocks=11)  # fmt: skip  # one 700-token prompt at a time

        def locate(s: Session, chain: Sequence[int]) -> tuple[int, int]:
            return on_gpu_and_tier(
                kv.feeder.index, kv.master.exist, s.deployment, s.tenant, s.home_instance, chain
            )

        ctl = RetentionController(
            kv.shell, mode="enforce", budget_share=0.0, tick_s=0.1, locate=locate
        )
        try:
            engine, url = await fleet.start(redis=kv.redis, instance_id="e0")
            ctl.urls["e0"] = url
            chain, want, returns_at = await _first_turn(kv, engine, url, http, clock, key, skey)
            clock.advance(1.0)  # idle long enough for the index to have seen the turn
            await ctl.tick()  # no pressure: kept on the GPU, nothing offloaded or recorded
            assert engine.core.cache.match(chain) == 10
            assert dict(kv.shell.table.get(skey).tiers) == {}
            assert ctl.stats["evicted_sessions"] == 0
            async with http.post(
                url + "/v1/completions", json={"prompt": OTHER, "max_tokens": 4}
            ) as r:
                assert r.status == 200  # evicts the session's blocks: to the tier
            await _gone_to_tier(kv, engine, chain)
            await ctl.tick()
            assert dict(kv.shell.table.get(skey).tiers) == {CPU: 10}
            assert ctl.stats["evicted_sessions"] == 1
            await _prefetch_and_next_turn(
                kv, ctl, engine, url, http, clock, key, skey, want, returns_at
            )
        finally:
            await ctl.close()
            await bounded(fleet.close(), "closing the engine")


async def _gone_to_tier(kv: KVMeta, engine: EngineServer, chain: list[int]) -> None:
    """Wait until the chain left the engine's GPU for the tier (and kvmeta's index saw it)."""
    keys = [block_key(h) for h in chain]

    async def offloaded() -> bool:
        stored = all(kv.master.exist(DEP, "", keys))
        return stored and engine.core.cache.held_slots == 0 and on_engine(kv, chain) == {}

    await eventually(offloaded)
    assert engine.core.cache.match(chain) == 0


async def _prefetch_and_next_turn(
    kv: KVMeta,
    ctl: RetentionController,
    engine: EngineServer,
    url: str,
    http: aiohttp.ClientSession,
    clock: ManualClock,
    key: dict[str, str],
    skey: tuple[str, str, str],
    want: dict[str, Any],
    returns_at: float,
) -> None:
    """The offloaded session is prefetched inside its lead; its next turn finds it cached."""
    assert engine.tier_io is not None
    chain = block_hashes(tokenize(LONG), engine.settings.block_size)
    # far from the return: nothing to prefetch yet
    clock.advance(GAP_S / 2)
    await ctl.tick()
    assert ctl.stats["prefetch_started"] == 0
    # inside the lead before the predicted return: the prefetch starts
    clock.set(returns_at - 0.3)
    await ctl.tick()
    assert (ctl.stats["prefetch_planned"], ctl.stats["prefetch_started"]) == (1, 1)

    async def back() -> bool:
        return engine.core.cache.match(chain) == 10 and on_engine(kv, chain) == {GPU: 10}

    await eventually(back)  # resident again, and kvmeta's index saw it from the KV events
    assert engine.tier_io.prefetched_blocks == 10
    assert engine.core.cache.protected_blocks == 10
    await ctl.tick()  # the engine reports the job done
    assert ctl.stats["prefetch_finished"] == 1 and ctl.stats["errors"] == 0
    assert dict(kv.shell.table.get(skey).tiers) == {GPU: 10}
    assert engine.core.cache.protected_blocks == 10  # held until the turn: not offloaded again
    # the next turn arrives: its prefix is cached, nothing computed or fetched for it
    computed = engine.core.prompt_tokens_total
    clock.set(returns_at)
    await kv.stub.StartSessionTurn(kvmeta_pb2.StartSessionTurnRequest(**key, home_instance="e0"))
    got = await complete(http, url)
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 640
    assert engine.core.prompt_tokens_total - computed == len(tokenize(LONG)) - 640
    assert engine.tier_io.fetched_blocks == 0  # the request itself fetched nothing
    assert engine.tier_io.prefetch_waits == 0
    await ctl.tick()
    assert (ctl.stats["prefetch_used"], ctl.stats["prefetch_late"]) == (1, 0)
    assert ctl.prefetches == {}


async def _turn(
    kv: KVMeta,
    http: aiohttp.ClientSession,
    url: str,
    iid: str,
    sid: str,
    prompt: str,
    block_size: int = 64,
) -> tuple[list[int], dict[str, Any]]:
    """One turn of session ``sid`` served on ``iid`` and reported as the gateway reports
    it: its chain and the answer."""
    key = {"deployment": DEP, "tenant": "", "session_id": sid}
    chain = block_hashes(tokenize(prompt), block_size)
    await kv.stub.StartSessionTurn(kvmeta_pb2.StartSessionTurnRequest(**key, home_instance=iid))
    answer = await complete(http, url, prompt)
    await kv.stub.EndSessionTurn(
        kvmeta_pb2.EndSessionTurnRequest(
            **key, tip_block_hash=chain[-1] if chain else 0, home_instance=iid,
            block_hashes=chain, tool_names=["bash"],
        )
    )  # fmt: skip
    return chain, answer


async def test_hot_engine_moves_an_idle_session_to_a_cool_one(
    postgres_db_url: str, redis_url: str, metadata_url: str, tmp_path: Path
) -> None:
    """Two idle sessions fill most of e0 while e1's only session holds nothing: the
    controller's rebalancing moves one (offloaded from e0 to the tier, prefetched to e1,
    re-homed there, then prefetched there before its return) and its next turn on e1 finds
    its prefix cached; the other stays."""
    clock = ManualClock(1_000_000.0)
    async with with_tier(postgres_db_url, redis_url, metadata_url, tmp_path, clock) as (kv, http):
        fleet = EngineFleet(tmp_path, serve="runner", profile="test", speedup=20.0,
                            deployment=DEP, kvcache_tier=True, kvcache_policy="offload_on_evict",
                            kvmeta_address=kv.address, te_metadata_url=metadata_url,
                            stream_prefix=kv.prefix, kv_flush_ms=10.0, kv_blocks=24)  # fmt: skip
        # budget 1: both idle sessions protected; only the rebalancing moves anything
        ctl = RetentionController(
            kv.shell, mode="enforce", budget_share=1.0, tick_s=0.1, rebalance=Rebalancer()
        )
        try:
            e0, u0 = await fleet.start(redis=kv.redis, instance_id="e0")
            e1, u1 = await fleet.start(redis=kv.redis, instance_id="e1")
            ctl.urls.update(e0=u0, e1=u1)
            a, _ = await _turn(kv, http, u0, "e0", "agent-a", LONG)
            b, _ = await _turn(kv, http, u0, "e0", "agent-b", OTHER)
            c, _ = await _turn(kv, http, u1, "e1", "agent-c", "short")
            assert c == []
            clock.advance(1.0)
            await ctl.tick()
            assert ctl.stats["rebalanced_sessions"] == 1 and ctl.stats["errors"] == 0
            assert kv.shell.table.get((DEP, "", "agent-a")).home_instance == "e1"
            assert kv.shell.table.get((DEP, "", "agent-b")).home_instance == "e0"

            s = kv.shell.table.get((DEP, "", "agent-a"))
            assert dict(s.tiers) == {CPU: 10}
            await _gone_to_tier(kv, e0, a)  # offloaded from e0, stored in the tier
            assert e0.core.cache.match(b) == 10
            await ctl.tick()  # nothing moves back, nor further
            assert ctl.stats["rebalanced_sessions"] == 1
            # inside the lead before its predicted return: prefetched to its new home
            clock.set(s.predicted_return_at - 0.3)
            await ctl.tick()
            assert ctl.stats["prefetch_started"] == 1

            async def back() -> bool:
                return e1.core.cache.match(a) == 10

            await eventually(back)
            computed = e1.core.prompt_tokens_total
            await kv.stub.StartSessionTurn(kvmeta_pb2.StartSessionTurnRequest(
                deployment=DEP, tenant="", session_id="agent-a", home_instance="e1"))  # fmt: skip
            got = await complete(http, u1)
            assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 640
            assert e1.core.prompt_tokens_total - computed == len(tokenize(LONG)) - 640
        finally:
            await ctl.close()
            await bounded(fleet.close(), "closing the engines")
