"""The gateway with API keys on, in front of an in-process simulated engine: 401 / 403 /
429 with OpenAI-style bodies, tenant and class from the key (never from a header), the
revocation delay (injected clock), rate limits shared by two replicas through a real
Redis, and the request limits set by settings (431, 400, 413)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestServer

from services.common.scheduling import EndpointSpec, build_core
from services.scheduler.core.records import RequestContext
from services.scheduler.http.openai import Limits, ParsedRequest
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.records import Ending
from services.scheduler.http.server import Gateway
from services.scheduler.keys.build import key_gate
from services.scheduler.keys.counters import Counters, MemoryCounters, RedisCounters
from services.scheduler.keys.gate import KeyGate
from services.scheduler.keys.ratelimit import WindowCounts
from services.scheduler.settings import SchedulerSettings
from tests.helpers.engines import EngineFleet
from tests.helpers.keys import FakeKeyStore, fake_gate
from tests.helpers.ports import free_port

LONG = " ".join(f"w{i}" for i in range(200))
Make = Callable[..., Awaitable[tuple[Gateway, str, list[RequestContext]]]]


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def engine_url(tmp_path: Path) -> AsyncIterator[str]:
    fleet = EngineFleet(tmp_path, profile="test", speedup=50.0, block_size=16)
    _, url = await fleet.start()
    yield url
    await fleet.close()


@pytest.fixture
async def make(engine_url: str) -> AsyncIterator[Make]:
    servers: list[TestServer] = []

    async def build(
        keys: KeyGate | None, limits: Limits | None = None
    ) -> tuple[Gateway, str, list[RequestContext]]:
        core = build_core([EndpointSpec("e1", engine_url)], perf_profile="test", block_size=16)
        opts = GatewayOptions(background=False, block_size=16, limits=limits or Limits())
        gw = Gateway(core, opts, keys=keys)
        seen: list[RequestContext] = []

        def keep(ctx: RequestContext, _end: Ending) -> None:
            seen.append(ctx)

        gw.finished.append(keep)
        server = TestServer(gw.app(), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        await gw.poll_load()
        return gw, str(server.make_url("")).rstrip("/"), seen

    yield build
    for s in servers:
        await s.close()


def completion(prompt: str = "hello there", **kw: Any) -> dict[str, Any]:
    return {"model": "tideserve-sim", "prompt": prompt, "max_tokens": 2, **kw}


def auth(key: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **headers}


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[int, dict[str, Any], Any]:
    async with http.post(url + "/v1/completions", json=body, headers=headers) as r:
        return r.status, await r.json(), r.headers


def is_openai_error(body: dict[str, Any], etype: str, code: str) -> bool:
    e = body["error"]
    return set(e) == {"message", "type", "param", "code"} and (e["type"], e["code"]) == (
        etype,
        code,
    )


async def test_who_may_call_and_revocation_within_the_ttl(
    make: Make, http: aiohttp.ClientSession
) -> None:
    store, clock = FakeKeyStore(), Clock()
    key = store.add("acme")
    _, url, _ = await make(fake_gate(store, clock=clock, ttl_s=5.0))
    async with http.get(url + "/health") as r:
        assert r.status == 200  # probes need no key
    async with http.get(url + "/v1/models") as r:
        assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        assert is_openai_error(await r.json(), "authentication_error", "missing_api_key")
    for bad in ("sk-ts-" + "x" * 43, "not-a-key", key + "x"):
        status, body, _ = await post(http, url, completion(), auth(bad))
        assert status == 401 and is_openai_error(body, "authentication_error", "invalid_api_key")
    status, body, _ = await post(http, url, completion(), auth(key))
    assert status == 200, body
    store.revoke(key)
    clock.t += 4.0
    assert (await post(http, url, completion(), auth(key)))[0] == 200  # cached: within TTL
    clock.t += 1.5
    status, body, _ = await post(http, url, completion(), auth(key))
    assert status == 401 and is_openai_error(body, "authentication_error", "invalid_api_key")
    store.fail = True  # Postgres down, a key never seen: 503, not a crash
    status, body, _ = await post(http, url, completion(), auth(store.add("newco")))
    assert status == 503 and body["error"]["code"] == "keys_unavailable"


@pytest.mark.parametrize(
    ("headers", "extra", "status", "tenant", "cls"),
    [
        ({}, {}, 200, "acme", "agent"),
        ({"X-Tideserve-Tenant": "acme", "X-Tideserve-Class": "batch"}, {}, 200, "acme", "batch"),
        ({"X-Tideserve-Tenant": "globex"}, {}, 403, "", ""),
        ({}, {"tenant": "globex"}, 403, "", ""),
        ({"X-Tideserve-Class": "interactive"}, {}, 403, "", ""),
        ({}, {"slo_class": "interactive"}, 403, "", ""),
    ],
    ids=[
        "from-the-key",
        "own-tenant-allowed-class",
        "other-tenant-header",
        "other-tenant-body",
        "class-not-allowed-header",
        "class-not-allowed-body",
    ],
)
async def test_tenant_and_class_come_from_the_key(
    make: Make,
    http: aiohttp.ClientSession,
    headers: dict[str, str],
    extra: dict[str, Any],
    status: int,
    tenant: str,
    cls: str,
) -> None:
    store = FakeKeyStore()
    key = store.add("acme", ["agent", "batch"])
    _, url, seen = await make(fake_gate(store))
    got, body, _ = await post(http, url, completion(**extra), auth(key, **headers))
    assert got == status, body
    if status == 403:
        assert is_openai_error(body, "permission_error", "forbidden")
        return
    parsed = seen[-1].parsed
    assert isinstance(parsed, ParsedRequest)
    assert (parsed.tenant, parsed.slo_class, parsed.cache_salt) == (tenant, cls, "acme:")
    assert parsed.forward_body["cache_salt"] == "acme:"  # the engine's cache namespace too


async def test_rate_limits_429_with_retry_after_and_too_large_400(
    make: Make, http: aiohttp.ClientSession
) -> None:
    store, wall = FakeKeyStore(), Clock(1_000_040.0)  # 20 s into a 60 s window
    key = store.add("acme", rpm=2, tpm=1000)
    _, url, _ = await make(fake_gate(store, wall=wall))
    for _ in range(2):
        assert (await post(http, url, completion(), auth(key)))[0] == 200
    status, body, headers = await post(http, url, completion(), auth(key))
    assert status == 429 and is_openai_error(body, "rate_limit_error", "rate_limit_exceeded")
    # 40 s to the next window, then 30 s for this one's 2 requests to weigh 1: 2 x 0.5 + 1
    assert int(headers["Retry-After"]) == 70
    status, body, _ = await post(http, url, completion(max_tokens=2000), auth(key))
    assert status == 400 and body["error"]["code"] == "tokens_over_limit"
    other = store.add("globex", rpm=2)  # another tenant's budget is its own
    assert (await post(http, url, completion(), auth(other)))[0] == 200
    wall.t += 70.0  # as told: the refused requests were not counted
    assert (await post(http, url, completion(), auth(key)))[0] == 200


@pytest.mark.integration
async def test_rate_limits_hold_across_replicas_through_redis(
    make: Make, http: aiohttp.ClientSession, redis_url: str
) -> None:
    store, wall = FakeKeyStore(), Clock(2_000_000.0)
    key = store.add("acme", rpm=3)
    clients = [aioredis.Redis.from_url(redis_url) for _ in range(2)]
    prefix = f"t{free_port()}"
    try:
        urls = []
        for c in clients:
            gate = fake_gate(store, counters=RedisCounters(c, prefix), wall=wall)
            urls.append((await make(gate))[1])
        statuses = [(await post(http, urls[i % 2], completion(), auth(key)))[0] for i in range(5)]
        assert statuses == [200, 200, 200, 429, 429]  # one budget over both replicas
    finally:
        for c in clients:
            await c.aclose()


async def test_redis_down_counts_in_the_replica(make: Make, http: aiohttp.ClientSession) -> None:
    store = FakeKeyStore()
    key = store.add("acme", rpm=1)
    settings = SchedulerSettings(
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        postgres_url="postgresql://unused@127.0.0.1:1/x",
        api_keys=True,
    )
    built = key_gate(settings)  # the product's counters client (its timeout, no retries)
    assert built is not None and isinstance(built.counters, RedisCounters)
    counters = built.counters
    _, url, _ = await make(fake_gate(store, counters=counters, wall=Clock(3_000_000.0)))
    assert (await post(http, url, completion(), auth(key)))[0] == 200
    assert (await post(http, url, completion(), auth(key)))[0] == 429
    assert counters.failures >= 2
    for close in built.closers:
        await close()


LIM = Limits(max_tokens=64, max_prompt_tokens=100, max_messages=2, max_header_bytes=2048)


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "code"),
    [
        ("/v1/completions", completion(), {"X-Big": "x" * 4000}, 431, "headers_too_large"),
        ("/v1/completions", completion(max_tokens=65), {}, 400, "invalid_value"),
        ("/v1/completions", completion(LONG), {}, 413, "prompt_too_long"),
        (
            "/v1/chat/completions",
            {
                "model": "tideserve-sim",
                "messages": [{"role": "user", "content": "hi"}] * 3,
                "max_tokens": 2,
            },
            {},
            400,
            "too_many_messages",
        ),
    ],
    ids=["headers", "max-tokens", "prompt-length", "messages"],
)
async def test_limits_by_settings(
    make: Make,
    http: aiohttp.ClientSession,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    status: int,
    code: str,
) -> None:
    _, url, _ = await make(None, LIM)
    async with http.post(url + path, json=body, headers=headers) as r:
        got = await r.json()
        assert r.status == status and got["error"]["code"] == code, got
    async with http.post(url + "/v1/completions", json=completion()) as r:
        assert r.status == 200  # and the gateway still serves


@pytest.mark.integration
async def test_redis_counters_count_like_the_in_process_ones(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    prefix = f"t{free_port()}"
    try:
        counters: list[Counters] = [MemoryCounters(), RedisCounters(client, prefix)]
        steps = [("a", 5, 1, 10), ("a", 6, 1, 20), ("a", 6, -1, -20), ("b", 6, 1, 1)]
        got = [[await c.add(t, i, r, k, 60_000) for t, i, r, k in steps] for c in counters]
        assert (
            got[0]
            == got[1]
            == [
                WindowCounts(0, 1, 0, 10),
                WindowCounts(1, 1, 10, 20),
                WindowCounts(1, 0, 10, 0),
                WindowCounts(0, 1, 0, 1),
            ]
        )
        ttl = await client.pttl(f"{prefix}:rl:a:6")
        assert 0 < ttl <= 120_000  # windows expire after two of them
    finally:
        await client.aclose()


class Counted:
    """Counters that count the calls (round trips) made through them."""

    def __init__(self, inner: Counters) -> None:
        self.inner, self.calls = inner, 0

    async def add(
        self, tenant: str, index: int, requests: int, tokens: int, window_ms: int
    ) -> WindowCounts:
        self.calls += 1
        return await self.inner.add(tenant, index, requests, tokens, window_ms)


@pytest.mark.integration
async def test_leases_admit_the_same_requests_with_few_round_trips(
    make: Make, http: aiohttp.ClientSession, redis_url: str
) -> None:
    """Two replicas leasing 10 % of rpm=40 at a time admit exactly 40 requests of the
    window, like per-request counting, in a fraction of the round trips; the unspent rest
    of a lease goes back to its window when the next one starts."""
    store, wall = FakeKeyStore(), Clock(4_000_020.0)
    key = store.add("acme", rpm=40)
    clients = [aioredis.Redis.from_url(redis_url) for _ in range(2)]
    prefix = f"t{free_port()}"
    try:
        counted = [Counted(RedisCounters(c, prefix)) for c in clients]
        urls = [
            (await make(fake_gate(store, counters=c, wall=wall, lease_fraction=0.1)))[1]
            for c in counted
        ]
        statuses = [(await post(http, urls[i % 2], completion(), auth(key)))[0] for i in range(43)]
        assert statuses == [200] * 40 + [429] * 3
        trips = sum(c.calls for c in counted)
        assert trips < 25  # 8 leases of 4 + the exact decisions near the limit, not 43
        wall.t += 90.0  # half into the next window: the last one weighs 20 of 40
        assert (await post(http, urls[0], completion(), auth(key)))[0] == 200  # leases 4
        wall.t += 60.0  # and the next: replica 0 gives back the 3 it did not spend
        assert (await post(http, urls[0], completion(), auth(key)))[0] == 200
        index = int(wall.t * 1000) // 60_000
        served = await clients[0].hmget(f"{prefix}:rl:acme:{index - 1}", "r")
        assert int(served[0]) == 1  # only what was served stays counted
    finally:
        for c in clients:
            await c.aclose()
