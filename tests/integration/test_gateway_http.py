"""The OpenAI gateway in front of in-process simulated engines (free ports, no Redis)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from services.common.admission import ClassSpec, QueueConfig
from services.common.scheduling import CoreLimits, EndpointSpec, build_core
from services.scheduler.http.openai import Limits
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.server import Gateway
from tests.helpers.engines import EngineFactory, EngineFleet, sse
from tests.helpers.ports import free_port

Engines = EngineFactory
LONG = " ".join(f"w{i}" for i in range(600))


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[Engines]:
    fleet = EngineFleet(tmp_path, profile="test", speedup=50.0)
    yield fleet.start
    await fleet.close()


GatewayFactory = Callable[..., Awaitable[tuple[Gateway, str]]]


@pytest.fixture
async def gateway() -> AsyncIterator[GatewayFactory]:
    servers: list[TestServer] = []

    async def make(
        specs: list[EndpointSpec], opts: GatewayOptions | None = None, **core_kw: Any
    ) -> tuple[Gateway, str]:
        core_kw.setdefault("perf_profile", "test")
        core = build_core(specs, **core_kw)
        gw = Gateway(core, opts or GatewayOptions(background=False, block_size=16, backoff_ms=1))
        server = TestServer(gw.app(), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        await gw.poll_load()
        return gw, str(server.make_url("")).rstrip("/")

    yield make
    for s in servers:
        await s.close()


def chat(content: str = "hello there", **kw: Any) -> dict[str, Any]:
    return {
        "model": "tideserve-sim",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        **kw,
    }


async def test_chat_completion_stream_and_models(
    engines: Engines, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    _, u1 = await engines()
    _, u2 = await engines()
    gw, url = await gateway([EndpointSpec("e1", u1), EndpointSpec("e2", u2)])
    async with http.get(url + "/v1/models") as r:
        assert r.status == 200 and [m["id"] for m in (await r.json())["data"]] == ["tideserve-sim"]
    async with http.post(url + "/v1/chat/completions", json=chat()) as r:
        body = await r.json()
        assert r.status == 200, body
        assert body["choices"][0]["message"]["content"] and body["usage"]["completion_tokens"] == 4
    async with http.post(url + "/v1/chat/completions", json=chat(stream=True)) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        events = await sse(r)
    assert events[-1] == "[DONE]" and len(events) >= 3
    async with http.post(
        url + "/v1/completions", json={"model": "tideserve-sim", "prompt": "a b c", "max_tokens": 2}
    ) as r:
        assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 2
    assert gw.core.fleet.in_flight("e1") == 0 and gw.core.fleet.in_flight("e2") == 0


async def test_models_of_an_endpoint_that_joined_since_the_last_poll(
    engines: Engines, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    """An endpoint added to the fleet after the last load poll (membership) is asked for its
    models when /v1/models is requested, not only at the next poll."""
    _, u1 = await engines()
    gw, url = await gateway([])  # polled once, with nothing to ask
    assert not gw.models
    gw.core.fleet.upsert(EndpointSpec("e1", u1))
    async with http.get(url + "/v1/models") as r:
        assert r.status == 200 and [m["id"] for m in (await r.json())["data"]] == ["tideserve-sim"]


@pytest.mark.parametrize(
    ("body", "headers", "status", "param"),
    [
        (b"{not json", {}, 400, None),
        (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), {}, 400, "model"),
        (json.dumps(chat(model="nope")).encode(), {}, 404, "model"),
        (json.dumps(chat(max_tokens=-1)).encode(), {}, 400, "max_tokens"),
        (json.dumps(chat(max_tokens=10**9)).encode(), {}, 400, "max_tokens"),
        (json.dumps(chat(max_tokens="5")).encode(), {}, 400, "max_tokens"),
        (json.dumps(chat(messages=[])).encode(), {}, 400, "messages"),
        (json.dumps(chat()).encode(), {"X-Tideserve-Class": "gold"}, 400, "slo_class"),
        (json.dumps(chat()).encode(), {"X-Tideserve-Profile": "nope"}, 400, "profile"),
        (json.dumps(chat(stream="yes")).encode(), {}, 400, "stream"),
        (json.dumps([1, 2]).encode(), {}, 400, None),
        (json.dumps(chat(content="x " * 700_000)).encode(), {}, 413, None),
    ],
    ids=[
        "invalid-json",
        "missing-model",
        "unknown-model",
        "negative-max-tokens",
        "absurd-max-tokens",
        "string-max-tokens",
        "empty-messages",
        "unknown-class",
        "unknown-profile",
        "bad-stream",
        "not-an-object",
        "oversized",
    ],
)
async def test_bad_input_is_refused_and_never_forwarded(
    engines: Engines,
    gateway: GatewayFactory,
    http: aiohttp.ClientSession,
    body: bytes,
    headers: dict[str, str],
    status: int,
    param: str | None,
) -> None:
    engine, u1 = await engines()
    opts = GatewayOptions(background=False, block_size=16, limits=Limits(max_body_bytes=1_000_000))
    gw, url = await gateway([EndpointSpec("e1", u1)], opts)
    async with http.post(
        url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", **headers},
    ) as r:
        err = await r.json()
        assert r.status == status, err
    assert set(err["error"]) == {"message", "type", "param", "code"} and err["error"]["message"]
    assert err["error"]["param"] == param
    assert engine.metrics is not None and gw.core.fleet.in_flight("e1") == 0


async def test_failing_engine_is_retried_before_first_byte(
    engines: Engines, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    _, bad = await engines(fail_rate=1.0)
    _, good = await engines()
    gw, url = await gateway([EndpointSpec("a-bad", bad), EndpointSpec("b-good", good)])
    for stream in (False, True):
        for _ in range(3):
            async with http.post(url + "/v1/chat/completions", json=chat(stream=stream)) as r:
                assert r.status == 200
                if stream:
                    assert (await sse(r))[-1] == "[DONE]"
    assert gw.metrics.value("tideserve_gateway_retries_total") >= 1
    assert gw.core.fleet.view("a-bad", gw.clock()).circuit in ("open", "half-open")


async def test_all_engines_failing_gives_502_then_503(
    engines: Engines, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    _, bad = await engines(fail_rate=1.0)
    _, url = await gateway([EndpointSpec("a", bad)])
    async with http.post(url + "/v1/chat/completions", json=chat()) as r:
        assert r.status in (502, 503)
        assert (await r.json())["error"]["type"] in ("server_error", "service_unavailable")


async def test_engine_dying_mid_stream_ends_with_an_error_event(
    engines: Engines, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    _, dying = await engines(die_after_tokens=3)
    gw, url = await gateway([EndpointSpec("a", dying)])
    async with http.post(url + "/v1/chat/completions", json=chat(stream=True, max_tokens=20)) as r:
        assert r.status == 200
        events = await sse(r)
    assert events[-1] == "[DONE]"
    assert any(isinstance(e, dict) and "error" in e for e in events)
    assert gw.core.fleet.in_flight("a") == 0


async def test_disaggregated_long_prompt_and_decode_only_short_prompt(
    engines: Engines, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    pe, pu = await engines(role="prefill")
    de, du = await engines(role="decode")
    # `threshold`: every long prompt is disaggregated (the default decider prices the paths
    # and keeps a cold prompt on an idle decode engine)
    opts = GatewayOptions(background=False, block_size=16, backoff_ms=1, profile="threshold")
    gw, url = await gateway(
        [EndpointSpec("p", pu, role="prefill"), EndpointSpec("d", du, role="decode")], opts
    )
    other = " ".join(f"v{i}" for i in range(600))
    for content, stream in ((LONG, False), (other, True)):
        async with http.post(url + "/v1/chat/completions", json=chat(content, stream=stream)) as r:
            assert r.status == 200, await r.text()
            if stream:
                assert (await sse(r))[-1] == "[DONE]"
    prefilled = pe.core.cache.query_tokens
    assert prefilled >= 2 * 512  # both long prompts were computed on the prefill engine
    decode_before = de.core.cache.query_tokens
    # Short prompt, and a follow-up whose prefix the decode engine already holds: decode-only.
    for content in ("short prompt", LONG + " and a follow up"):
        async with http.post(url + "/v1/chat/completions", json=chat(content)) as r:
            assert r.status == 200
    assert pe.core.cache.query_tokens == prefilled
    assert de.core.cache.query_tokens > decode_before
    assert gw.core.fleet.in_flight("p") == 0 and gw.core.fleet.in_flight("d") == 0


@pytest.mark.parametrize(
    ("can_prefill", "with_prefill", "status", "prefilled"),
    [
        (True, True, 200, False),  # short prompt: the decode engine computes it
        (False, True, 200, True),  # SGLang decode servers cannot: always disaggregated
        (True, False, 200, False),  # no prefill engine: decode-only
        (False, False, 503, False),  # no prefill engine and none can compute it: refused
    ],
    ids=["can-short-local", "cannot-short-split", "can-no-prefill", "cannot-no-prefill-503"],
)
async def test_decode_engines_that_cannot_prefill_never_get_a_prompt_alone(
    engines: Engines,
    gateway: GatewayFactory,
    http: aiohttp.ClientSession,
    can_prefill: bool,
    with_prefill: bool,
    status: int,
    prefilled: bool,
) -> None:
    specs = []
    pe = None
    if with_prefill:
        pe, pu = await engines(role="prefill")
        specs.append(EndpointSpec("p", pu, role="prefill"))
    de, du = await engines(role="decode")
    specs.append(EndpointSpec("d", du, role="decode"))
    gw, url = await gateway(specs, decode_can_prefill=can_prefill)
    async with http.post(url + "/v1/chat/completions", json=chat("short prompt")) as r:
        assert r.status == status, await r.text()
        if status == 503:
            err = (await r.json())["error"]
            assert err["code"] == "no_endpoint"
            assert "decode endpoints cannot compute prompts" in err["message"]
            assert de.core.prompt_tokens_total == 0  # never forwarded
    if pe is not None:
        assert (pe.core.prompt_tokens_total > 0) is prefilled
    assert gw.core.fleet.in_flight("d") == 0


async def test_second_turn_goes_where_the_first_was_cached(
    engines: Engines, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    e1, u1 = await engines()
    e2, u2 = await engines()
    _, url = await gateway([EndpointSpec("e1", u1), EndpointSpec("e2", u2)])
    async with http.post(url + "/v1/chat/completions", json=chat(LONG)) as r:
        assert r.status == 200
    async with http.post(url + "/v1/chat/completions", json=chat(LONG + " and a follow up")) as r:
        assert r.status == 200
    hits = [e1.core.cache.hit_tokens, e2.core.cache.hit_tokens]
    assert max(hits) >= 512 and min(hits) == 0


async def test_shed_when_saturated_returns_429_with_retry_after(
    engines: Engines, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    _, u1 = await engines()
    queue = QueueConfig(
        classes=(
            ClassSpec("interactive", 30, max_queue_ms=50, max_queued=0),
            ClassSpec("agent", 20, max_queue_ms=50),
        ),
        default_class="agent",
    )
    opts = GatewayOptions(
        block_size=16, queue_tick_s=0.01, health_interval_s=30, load_interval_s=30
    )
    gw, url = await gateway(
        [EndpointSpec("e1", u1)], opts, queue=queue, limits=CoreLimits(max_in_flight_per_endpoint=0)
    )
    hdr = {"X-Tideserve-Class": "interactive"}
    async with http.post(url + "/v1/chat/completions", json=chat(), headers=hdr) as r:
        assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
        assert (await r.json())["error"]["type"] == "rate_limit_error"
    # Accepted into the agent queue, never dispatched (no capacity), expired by the pump.
    async with http.post(url + "/v1/chat/completions", json=chat()) as r:
        assert r.status == 429 and "timed out" in (await r.json())["error"]["message"]
    assert len(gw.core.queue) == 0


async def test_unreachable_engine_is_retried_and_probed_unhealthy(
    engines: Engines, gateway: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    _, good = await engines()
    gw, url = await gateway([EndpointSpec("a-dead", dead), EndpointSpec("b-good", good)])
    for _ in range(3):
        async with http.post(url + "/v1/chat/completions", json=chat()) as r:
            assert r.status == 200
    for _ in range(2):
        await gw.check_health()
    view = gw.core.fleet.view("a-dead", gw.clock())
    assert not view.healthy and gw.core.fleet.view("b-good", gw.clock()).healthy
