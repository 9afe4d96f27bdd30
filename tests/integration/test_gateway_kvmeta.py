"""Precise prefix through kvmeta: simulated engines publish KV events to a real Redis,
kvmeta (assembled in process: feeder + servicer on a free port) indexes them, and the
gateway's MatchPrefix lookup steers a request to the engine that holds its prefix — a
prefix the gateway itself never routed. Failures (kvmeta down, too slow) fall back to no
precise data, counted."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestServer
from tideserve.v1 import kvmeta_pb2, kvmeta_pb2_grpc

from services.common.routing.types import RequestView
from services.common.scheduling import EndpointSpec, build_core
from services.common.tokens import block_hashes, tokenize
from services.engine.server import EngineServer
from services.engine.settings import EngineSettings
from services.kvmeta.ingest import IndexFeeder
from services.scheduler.feeds.kvmeta_client import KVMetaLookup, precise_profiles
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway
from services.scheduler.keys.gate import KeyGate
from services.scheduler.keys.model import tenant_salt
from tests.helpers.keys import FakeKeyStore, fake_gate
from tests.helpers.kvmeta import serve_kvmeta
from tests.helpers.ports import free_port
from tests.helpers.views import request_view
from tests.helpers.waits import bounded, eventually

BS = 16
SHARED = " ".join(f"doc{i}" for i in range(400))  # 25 blocks


@dataclass
class Env:
    prefix: str
    deployment: str
    engines: dict[str, str]  # instance id -> url
    redis: aioredis.Redis


@pytest.fixture
async def env(tmp_path: Path, redis_url: str) -> AsyncIterator[Env]:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    dep = "llama"
    redis = aioredis.Redis.from_url(redis_url, decode_responses=False)
    servers: list[TestServer] = []
    engines: dict[str, str] = {}
    for i in range(3):
        iid = f"e{i}"
        s = EngineSettings(
            port=0,
            instance_id=iid,
            profile="test",
            speedup=50.0,
            block_size=BS,
            redis_url=redis_url,
            deployment=dep,
            stream_prefix=prefix,
            kv_flush_ms=10.0,
            state_dir=tmp_path / iid,
        )
        srv = TestServer(EngineServer(s, redis=redis).app(), host="127.0.0.1")
        await srv.start_server()
        servers.append(srv)
        engines[iid] = str(srv.make_url("")).rstrip("/")
    try:
        yield Env(prefix, dep, engines, redis)
    finally:
        for srv in servers:
            await bounded(srv.close(), "closing a simulated engine")
        await bounded(redis.aclose(), "closing the Redis client")


@pytest.fixture
async def kvmeta(env: Env) -> AsyncIterator[tuple[str, IndexFeeder]]:
    async with serve_kvmeta(env.redis, env.prefix) as served:
        yield served


async def make_gateway(
    env: Env, address: str, deadline_s: float = 0.5, keys: KeyGate | None = None
) -> tuple[Gateway, str]:
    core = build_core(
        [EndpointSpec(i, u) for i, u in env.engines.items()], perf_profile="test", block_size=BS
    )
    channel = grpc.aio.insecure_channel(address)
    lookup = KVMetaLookup(
        channel,
        candidates=core.fleet.ids,
        profiles=precise_profiles(core.scheduler),
        deadline_s=deadline_s,
    )
    gw = Gateway(
        core,
        GatewayOptions(background=False, block_size=BS, deployment=env.deployment),
        prefix_lookup=lookup,
        keys=keys,
    )
    srv = TestServer(gw.app(), host="127.0.0.1")
    await srv.start_server()
    gw_servers.append((srv, channel))
    await gw.poll_load()
    return gw, str(srv.make_url("")).rstrip("/")


gw_servers: list[tuple[TestServer, grpc.aio.Channel]] = []


@pytest.fixture(autouse=True)
async def _close_gateways() -> AsyncIterator[None]:
    yield
    while gw_servers:
        srv, ch = gw_servers.pop()
        await bounded(srv.close(), "closing the gateway")
        await bounded(ch.close(), "closing the kvmeta channel")


def body(prompt: str, **kw: Any) -> dict[str, Any]:
    return {"model": "tideserve-sim", "prompt": prompt, "max_tokens": 2, **kw}


async def wait_indexed(
    feeder: IndexFeeder, env: Env, iid: str | None, blocks: int, salt: str = ""
) -> None:
    """Until kvmeta holds ``blocks`` of SHARED (in namespace ``salt``) on ``iid`` (None:
    on any instance)."""
    hashes = block_hashes(tokenize(SHARED), BS, tenant=salt)

    async def indexed() -> bool:
        if env.deployment not in feeder.block_sizes:
            return False
        got = feeder.index.match_prefix(env.deployment, salt, hashes, [iid] if iid else None)
        return bool(got) and got[0].matched_blocks >= blocks

    await eventually(indexed, within_s=60.0)


async def test_request_goes_to_the_engine_kvmeta_says_holds_the_prefix(
    env: Env, kvmeta: tuple[str, IndexFeeder]
) -> None:
    address, feeder = kvmeta
    async with aiohttp.ClientSession() as http:
        # e2 computes the shared document directly (the gateway never sees this request).
        async with http.post(env.engines["e2"] + "/v1/completions", json=body(SHARED)) as r:
            assert r.status == 200
        await wait_indexed(feeder, env, "e2", 25)
        gw, url = await make_gateway(env, address)
        prompt = SHARED + " question one"
        async with http.post(url + "/v1/completions", json=body(prompt)) as r:
            assert r.status == 200
            usage = (await r.json())["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 25 * BS  # served from e2's cache
    assert gw.prefix_lookup is not None
    stats = gw.prefix_lookup.stats  # type: ignore[attr-defined]
    assert stats["ok"] == 1 and stats["timeouts"] == stats["errors"] == 0


async def test_without_the_lookup_the_prefix_is_not_found(env: Env) -> None:
    """Control: the same traffic without kvmeta lands on the tie-break winner (no cache)."""
    async with aiohttp.ClientSession() as http:
        async with http.post(env.engines["e2"] + "/v1/completions", json=body(SHARED)) as r:
            assert r.status == 200
        core = build_core(
            [EndpointSpec(i, u) for i, u in env.engines.items()],
            perf_profile="test",
            block_size=BS,
        )
        gw = Gateway(core, GatewayOptions(background=False, block_size=BS))
        srv = TestServer(gw.app(), host="127.0.0.1")
        await srv.start_server()
        try:
            await gw.poll_load()
            url = str(srv.make_url("")).rstrip("/")
            async with http.post(url + "/v1/completions", json=body(SHARED + " q")) as r:
                usage = (await r.json())["usage"]
        finally:
            await srv.close()
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def view() -> RequestView:
    return request_view(tokens=tokenize(SHARED), block_size=BS, prompt_tokens=400)


async def test_lookup_failures_fall_back_and_are_counted(env: Env) -> None:
    # Nothing listens on the address: UNAVAILABLE → None, counted as an error.
    gw, url = await make_gateway(env, f"127.0.0.1:{free_port()}", deadline_s=0.2)
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/completions", json=body(SHARED)) as r:
            assert r.status == 200  # served without precise data
    stats = gw.prefix_lookup.stats  # type: ignore[union-attr]
    assert stats["calls"] == 1 and stats["ok"] == 0
    assert stats["errors"] + stats["timeouts"] == 1
    # A profile without a precise scorer does not ask at all.
    assert await gw.prefix_lookup(view(), env.deployment, "", "round_robin") is None  # type: ignore[misc]
    assert stats["skipped"] == 1 and stats["calls"] == 1


async def test_slow_kvmeta_hits_the_deadline(env: Env) -> None:
    class Slow(kvmeta_pb2_grpc.KVMetaServiceServicer):  # type: ignore[misc]
        async def MatchPrefix(self, request: Any, context: Any) -> Any:
            await asyncio.sleep(1.0)
            raise AssertionError("unreachable: the caller's deadline passed")

    server = grpc.aio.server()
    kvmeta_pb2_grpc.add_KVMetaServiceServicer_to_server(Slow(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        lookup = KVMetaLookup(channel, candidates=lambda: ["e0"], deadline_s=0.02)
        assert await lookup(view(), env.deployment) is None
        assert lookup.stats["timeouts"] == 1
        await channel.close()
    finally:
        await server.stop(None)


async def test_unknown_deployment_is_no_data_counted_apart(kvmeta: tuple[str, IndexFeeder]) -> None:
    address, _ = kvmeta
    async with grpc.aio.insecure_channel(address) as channel:
        lookup = KVMetaLookup(channel, deadline_s=1.0)
        assert await lookup(view(), "never-seen") is None
        assert lookup.stats["unknown"] == 1


async def test_grpc_pick_uses_kvmeta_too(env: Env, kvmeta: tuple[str, IndexFeeder]) -> None:
    """SchedulerService.Pick (no proxying) asks kvmeta the same way the HTTP gateway does."""
    from tideserve.v1 import scheduler_pb2, scheduler_pb2_grpc

    from services.scheduler.grpc.servicer import SchedulerServicer
    from services.scheduler.grpc.servicer import add_to_server as add_scheduler

    address, feeder = kvmeta
    async with aiohttp.ClientSession() as http:
        async with http.post(env.engines["e1"] + "/v1/completions", json=body(SHARED)) as r:
            assert r.status == 200
    await wait_indexed(feeder, env, "e1", 25)
    core = build_core(
        [EndpointSpec(i, u) for i, u in env.engines.items()], perf_profile="test", block_size=BS
    )
    async with grpc.aio.insecure_channel(address) as kv_channel:
        # the first call also connects the channel: the product's 20 ms default deadline is
        # for a warm channel, and a loaded machine misses it (the Pick then has no kvmeta data)
        lookup = KVMetaLookup(
            kv_channel,
            candidates=core.fleet.ids,
            profiles=precise_profiles(core.scheduler),
            deadline_s=5.0,
        )
        servicer = SchedulerServicer(
            core, deployment=env.deployment, block_size=BS, prefix_lookup=lookup
        )
        server = grpc.aio.server()
        add_scheduler(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = scheduler_pb2_grpc.SchedulerServiceStub(ch)
                resp = await stub.Pick(
                    scheduler_pb2.PickRequest(deployment=env.deployment, prompt_text=SHARED + " q")
                )
        finally:
            await server.stop(None)
    assert resp.decode.instance.instance_id == "e1"
    assert resp.predicted_cached_tokens == 25 * BS
    assert lookup.stats["ok"] == 1


@pytest.mark.integration
async def test_tenants_can_neither_reuse_nor_learn_of_each_others_prefix(
    env: Env, kvmeta: tuple[str, IndexFeeder]
) -> None:
    """Keys on: globex's cached document helps globex (the control: reuse works) and
    nobody else. kvmeta's index, asked in acme's namespace, knows of no block of it (only
    globex's namespace does); acme, sending the same prompt (plain, with globex's salt, or
    claiming to be globex), computes it from scratch wherever it lands."""
    address, feeder = kvmeta
    store = FakeKeyStore()
    acme, globex = store.add("acme"), store.add("globex")
    _, url = await make_gateway(env, address, keys=fake_gate(store))
    prompt = SHARED + " question"
    acme_ns, globex_ns = tenant_salt("acme", ""), tenant_salt("globex", "")

    async def cached(key: str, headers: dict[str, str] | None = None, **kw: Any) -> Any:
        h = {"Authorization": f"Bearer {key}", **(headers or {})}
        async with http.post(url + "/v1/completions", json=body(prompt, **kw), headers=h) as r:
            if r.status != 200:
                return r.status
            return (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"]

    channel = grpc.aio.insecure_channel(address)
    stub = kvmeta_pb2_grpc.KVMetaServiceStub(channel)

    async def matched(namespace: str, hash_salt: str) -> int:
        req = kvmeta_pb2.MatchPrefixRequest(
            deployment=env.deployment,
            tenant=namespace,
            block_hashes=block_hashes(tokenize(SHARED), BS, tenant=hash_salt),
        )
        resp = await stub.MatchPrefix(req, timeout=5)
        return max((m.matched_blocks for m in resp.matches), default=0)

    try:
        async with aiohttp.ClientSession() as http:
            assert await cached(globex) == 0
            await wait_indexed(feeder, env, None, 25, globex_ns)
            assert await cached(globex) == 25 * BS  # the owner reuses it
            # through the gRPC API: only globex's namespace holds the document
            assert await matched(globex_ns, globex_ns) == 25  # control: the owner's view
            assert await matched(acme_ns, acme_ns) == 0  # acme's own lookup of the prompt
            assert await matched(acme_ns, globex_ns) == 0  # even holding globex's hashes
            assert await matched("", "") == 0  # nothing in the unscoped namespace
            # through the gateway: each probe in its own namespace (acme's earlier probe
            # of the same namespace would be a hit of acme's own)
            assert await cached(acme) == 0
            assert await cached(acme, cache_salt=globex_ns) == 0
            assert await cached(acme, {"X-Tideserve-Tenant": "globex"}) == 403
            assert await cached(acme) == 25 * BS  # control: acme reuses its own
    finally:
        await channel.close()
